"""`ddtree-bench explain`: find why a server's DFlash/DDTree acceptance differs from z-lab's drafter.

curves.py        per-depth curves, their distance, where two runs part
config_check.py  classic drafter config faults, from config.json and safetensors headers
replay.py        a run's requests on the reference engine under one DraftVariant
analyse.py       the whole instrument: config, replay, ranking, verdict, JSON (explain.json)
"""
