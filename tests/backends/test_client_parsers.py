"""Response parsers: SGLang, vLLM and our shapes (serving-engines.md §1.5-1.9, §2.4, §3.2-3.3), streaming and not."""

from __future__ import annotations

import pytest

from ddtree_bench.backends.parsers import (
    ResponseError, StreamState, accept_lengths_from_stats, error_message, parse_response, spec_stats, stats_totals,
)


def fold(chunks):
    st = StreamState()
    counts = [st.feed(c).num_tokens for c in chunks]
    return st, counts


# ---------------------------------------------------------------------------- vLLM


def test_vllm_completions_stream_with_token_ids_and_final_usage_metrics():
    hist = [2, 1, 0, 3]  # k = 3: two steps accepted 0 drafts, one 1, three 3
    chunks = [
        {"object": "text_completion", "choices": [{"index": 0, "text": "Hel", "token_ids": [10, 11], "prompt_token_ids": [1, 2, 3],
                                                    "finish_reason": None}]},
        {"object": "text_completion", "choices": [{"index": 0, "text": "lo wor", "token_ids": [12, 13, 14, 15], "finish_reason": None}]},
        {"object": "text_completion", "choices": [{"index": 0, "text": "ld", "token_ids": [16], "finish_reason": "length"}]},
        {"object": "text_completion", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 7, "total_tokens": 10},
         "metrics": {"speculative_decoding": {"mean_acceptance_length": 1 + 10 / 6, "draft_acceptance_rate": 10 / 18,
                                              "acceptance_histogram": hist, "num_spec_steps": 6, "num_accepted_draft_tokens": 10,
                                              "num_draft_tokens": 18, "num_spec_tokens": 3}}},
    ]
    st, counts = fold(chunks)
    assert counts == [2, 4, 1, 0]  # chunk-aware: a chunk of k ids is k tokens; the usage chunk is none
    assert st.text == "Hello world"
    assert st.output_ids == [10, 11, 12, 13, 14, 15, 16] and st.prompt_ids == [1, 2, 3]
    assert st.finish_reason == "length" and st.usage_completion_tokens == 7 and st.usage_prompt_tokens == 3
    assert st.stats["source"] == "vllm"
    rounds, source = accept_lengths_from_stats(st.stats)
    assert source == "histogram"
    assert sorted(rounds) == [1, 1, 2, 4, 4, 4]
    assert sum(a - 1 for a in rounds) == 10 and len(rounds) == 6  # reconciles with the totals
    assert stats_totals(st.stats) == {"rounds": 6, "accepted_drafts": 10, "proposed_drafts": 18,
                                      "mean_acceptance_length": pytest.approx(1 + 10 / 6)}


def test_vllm_chat_stream_prompt_ids_top_level_and_role_chunk_has_no_tokens():
    chunks = [
        {"object": "chat.completion.chunk", "prompt_token_ids": [5, 6],
         "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "token_ids": [], "finish_reason": None}]},
        {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "ab"}, "token_ids": [97, 98]}]},
        {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "token_ids": [], "finish_reason": "stop"}]},
    ]
    st, counts = fold(chunks)
    assert counts == [0, 2, 0]
    assert st.prompt_ids == [5, 6] and st.output_ids == [97, 98] and st.text == "ab" and st.finish_reason == "stop"
    assert st.stats is None


def test_vllm_detailed_per_step_gives_exact_rounds():
    body = {"choices": [{"index": 0, "text": "x", "finish_reason": "stop"}],
            "metrics": {"speculative_decoding": {"num_spec_steps": 3, "acceptance_histogram": [1, 1, 1],
                                                 "per_step_accepted": [2, 0, 1], "per_step_drafted": [2, 2, 2]}}}
    rounds, source = accept_lengths_from_stats(parse_response(body).stats)
    assert (rounds, source) == ([3, 1, 2], "rounds")  # order kept, bonus counted


def test_vllm_non_streaming_chat():
    body = {"object": "chat.completion", "prompt_token_ids": [1],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "token_ids": [104, 105], "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
            "metrics": {"speculative_decoding": {"num_spec_steps": 1, "acceptance_histogram": [0, 1]}}}
    st = parse_response(body)
    assert (st.text, st.output_ids, st.prompt_ids, st.finish_reason) == ("hi", [104, 105], [1], "stop")
    assert accept_lengths_from_stats(st.stats) == ([2], "histogram")


# ---------------------------------------------------------------------------- SGLang


SGLANG_DETAILS = {"spec_accept_rate": 7 / 24, "spec_accept_length": 2.0, "spec_num_correct_drafts": 7,
                  "spec_num_proposed_drafts": 24, "spec_verify_ct": 4, "spec_correct_drafts_histogram": [1, 1, 1, 0, 1]}


def test_sglang_sglext_stream_chunk_before_usage_and_continuous_usage_counts():
    chunks = [  # no token ids: per-chunk counts come from continuous usage
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "A"}, "finish_reason": None}],
         "usage": {"prompt_tokens": 4, "completion_tokens": 1}},
        {"choices": [{"index": 0, "delta": {"content": "BCD"}, "finish_reason": None}], "usage": {"prompt_tokens": 4, "completion_tokens": 4}},
        {"choices": [{"index": 0, "delta": {"content": "E"}, "finish_reason": "length"}], "usage": {"prompt_tokens": 4, "completion_tokens": 5}},
        {"choices": [], "sglext": {"spec_tokens_details": SGLANG_DETAILS}},
        {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 5, "total_tokens": 9}},
    ]
    st, counts = fold(chunks)
    assert counts == [1, 3, 1, 0, 0]
    assert st.token_count_source == "usage" and not st.saw_token_ids
    assert st.stats["source"] == "sglang-sglext"
    rounds, source = accept_lengths_from_stats(st.stats)
    assert source == "histogram" and sorted(rounds) == [1, 2, 3, 5]
    assert len(rounds) == SGLANG_DETAILS["spec_verify_ct"] and sum(a - 1 for a in rounds) == SGLANG_DETAILS["spec_num_correct_drafts"]


def test_sglang_sglext_list_when_n_gt_1_takes_the_first():
    other = dict(SGLANG_DETAILS, spec_correct_drafts_histogram=[9])
    stats = spec_stats({"choices": [], "sglext": {"spec_tokens_details": [SGLANG_DETAILS, other]}})
    assert sorted(accept_lengths_from_stats(stats)[0]) == [1, 2, 3, 5]


def test_sglang_generate_meta_info_non_streaming_and_old_key_names():
    body = {"text": "hello", "output_ids": [1, 2, 3],
            "meta_info": {"id": "x", "finish_reason": {"type": "length"}, "prompt_tokens": 7, "completion_tokens": 5,
                          "e2e_latency": 0.1, "spec_verify_ct": 3, "spec_accept_length": 5 / 3,
                          "spec_accepted_drafts": 2, "spec_proposed_drafts": 45, "spec_accept_histogram": [1, 2]}}
    stats = spec_stats(body)
    assert stats["source"] == "sglang-meta_info" and "id" not in stats and stats["completion_tokens"] == 5
    assert accept_lengths_from_stats(stats) == ([1, 2, 2], "histogram")  # 0.5.11 names
    assert stats_totals(stats)["accepted_drafts"] == 2 and stats_totals(stats)["proposed_drafts"] == 45
    oldest = {"meta_info": {"spec_verify_ct": 2, "spec_accept_token_num": 1, "spec_draft_token_num": 30}}
    s = spec_stats(oldest)
    assert accept_lengths_from_stats(s) == (None, None)  # totals alone cannot give rounds
    assert stats_totals(s) == {"rounds": 2, "accepted_drafts": 1, "proposed_drafts": 30, "mean_acceptance_length": None}


def test_sglang_chat_return_meta_info_in_choice():
    body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop",
                         "meta_info": {"spec_verify_ct": 2, "spec_correct_drafts_histogram": [0, 0, 2]}}]}
    st = parse_response(body)
    assert st.text == "ok" and accept_lengths_from_stats(st.stats) == ([3, 3], "histogram")


# ---------------------------------------------------------------------------- ours and edge cases


def test_ours_exact_acceptance_lengths_win_over_the_histogram():
    sd = {"method": "ddtree", "acceptance_lengths": [3, 1, 4], "acceptance_histogram": [1, 0, 1, 1], "num_spec_steps": 3}
    stats = spec_stats({"choices": [], "metrics": {"speculative_decoding": sd}})
    assert stats["source"] == "ddtree-bench"
    assert accept_lengths_from_stats(stats) == ([3, 1, 4], "rounds")


def test_text_only_stream_counts_one_token_per_text_chunk_and_flags_it():
    st, counts = fold([{"choices": [{"index": 0, "text": "ab"}]}, {"choices": [{"index": 0, "text": ""}]},
                       {"choices": [{"index": 0, "text": "c", "finish_reason": "stop"}]}])
    assert counts == [1, 0, 1] and st.token_count_source == "text-chunks" and st.text == "abc"


@pytest.mark.parametrize("body,msg", [
    ({"error": {"message": "max_tokens too large", "type": "BadRequestError", "code": 400}}, "max_tokens too large"),
    ({"object": "error", "message": "The model `x` does not exist.", "type": "NotFoundError", "code": 404}, "The model `x` does not exist."),
    ({"detail": [{"loc": ["body", "prompt"], "msg": "field required"}]}, "field required"),
    ({"detail": "Not Found"}, "Not Found"),
    ({"error": "queue full"}, "queue full"),
])
def test_error_message_shapes(body, msg):
    assert error_message(body) == msg


def test_error_event_in_stream_raises():
    st = StreamState()
    st.feed({"choices": [{"index": 0, "text": "a", "token_ids": [97]}]})
    with pytest.raises(ResponseError, match="engine died"):
        st.feed({"error": {"message": "engine died", "code": 500}})


def test_histogram_garbage_is_ignored():
    assert accept_lengths_from_stats({"acceptance_histogram": [1, -1]}) == (None, None)
    assert accept_lengths_from_stats({"acceptance_lengths": [0, 2]}) == (None, None)
    assert accept_lengths_from_stats(None) == (None, None)


# ---------------------------------------------------------------------------- cumulative usage on the last chunk (issue 15)


def _text_stream(pieces, final_text="", usage_tokens=None):
    """transformers serve's chat stream shape: a role chunk, text-only deltas (several characters
    each), then a last chunk that still has a choice, its finish_reason and the cumulative usage."""
    chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant"}}]}]
    chunks += [{"choices": [{"index": 0, "delta": {"content": p}}]} for p in pieces]
    last = {"index": 0, "delta": {"content": final_text} if final_text else {}, "finish_reason": "length"}
    chunks.append({"choices": [last], "usage": {"prompt_tokens": 31, "completion_tokens": usage_tokens, "total_tokens": 31 + usage_tokens}})
    return chunks


def test_cumulative_usage_on_the_last_chunk_with_choices_is_not_credited_again():
    # 64 generated tokens reach the client as 50 text chunks; usage (64) arrives once, on the finish chunk.
    pieces = ["ab"] * 14 + ["c"] * 36
    st, counts = fold(_text_stream(pieces, usage_tokens=64))
    assert sum(counts) == 50, "the finish chunk was credited the cumulative usage on top of the text chunks"
    assert counts[0] == 0 and counts[-1] == 0 and set(counts[1:-1]) == {1}
    assert st.token_count_source == "text-chunks" and st.usage_completion_tokens == 64 and st.finish_reason == "length"


def test_cumulative_usage_on_a_last_chunk_that_carries_text_counts_that_text_only():
    st, counts = fold(_text_stream(["a", "b"], final_text="c", usage_tokens=3))
    assert counts == [0, 1, 1, 1] and st.text == "abc"


def test_continuous_usage_from_the_first_chunk_still_counts_by_growth():
    chunks = [{"choices": [{"index": 0, "delta": {"content": "ab"}}], "usage": {"completion_tokens": 2}},
              {"choices": [{"index": 0, "delta": {"content": "cde"}}], "usage": {"completion_tokens": 5}},
              {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": {"completion_tokens": 5}}]
    st, counts = fold(chunks)
    assert counts == [2, 3, 0] and st.token_count_source == "usage"


def test_one_body_with_usage_is_one_chunk_of_all_its_tokens():
    st = parse_response({"choices": [{"index": 0, "message": {"role": "assistant", "content": "abc"}, "finish_reason": "stop"}],
                         "usage": {"prompt_tokens": 3, "completion_tokens": 3}})
    assert st.text == "abc" and st.output_ids == [] and not st.saw_token_ids and st.finish_reason == "stop"


# ---------------------------------------------------------------------------- SGLang chat token ids


def test_sglang_streamed_chat_ids_come_whole_in_the_sglext_chunk():
    # return_output_ids_in_sglext / return_input_ids_in_sglext (serving_chat.py): per-chunk counts from
    # the continuous usage, the ids once, in a choices: [] chunk; output_ids is one list per choice.
    chunks = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}], "usage": {"completion_tokens": 0}},
        {"choices": [{"index": 0, "delta": {"content": "Hel"}}], "usage": {"completion_tokens": 2}},
        {"choices": [{"index": 0, "delta": {"content": "lo!"}, "finish_reason": "stop"}], "usage": {"completion_tokens": 4}},
        {"choices": [], "sglext": {"input_ids": [1, 2, 3], "output_ids": [[10, 11, 12, 13]],
                                   "spec_tokens_details": {"spec_verify_ct": 2, "spec_correct_drafts_histogram": [0, 1, 1]}}},
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}},
    ]
    st, counts = fold(chunks)
    assert counts == [0, 2, 2, 0, 0]
    assert st.saw_token_ids and st.output_ids == [10, 11, 12, 13] and st.prompt_ids == [1, 2, 3]
    assert st.text == "Hello!" and st.finish_reason == "stop" and st.stats["source"] == "sglang-sglext"


def test_sglang_nonstreaming_chat_response_token_ids_and_prompt_ids():
    body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "length",
                         "prompt_token_ids": [4, 5], "response_token_ids": [7, 8]}],
            "usage": {"prompt_tokens": 2, "completion_tokens": 2}}
    st = parse_response(body)
    assert st.output_ids == [7, 8] and st.saw_token_ids and st.prompt_ids == [4, 5] and st.token_count_source == "token_ids"


def test_sglang_nonstreaming_chat_ids_in_sglext_only():
    body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
            "sglext": {"input_ids": [4, 5], "output_ids": [[7, 8, 9]]}, "usage": {"prompt_tokens": 2, "completion_tokens": 3}}
    st = StreamState()
    assert st.feed(body).num_tokens == 3
    assert st.output_ids == [7, 8, 9] and st.prompt_ids == [4, 5]


def test_sglext_chunk_replaces_ids_already_streamed_instead_of_doubling_them():
    chunks = [{"choices": [{"index": 0, "text": "ab", "token_ids": [1, 2]}]},
              {"choices": [], "sglext": {"output_ids": [[1, 2]]}}]
    st, counts = fold(chunks)
    assert counts == [2, 0] and st.output_ids == [1, 2]
