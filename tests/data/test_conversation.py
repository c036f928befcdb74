"""Conversational rows (TRL's chat-message forms): validation, rendering by a chat template, tokenization.

Real multi-turn HH-RLHF dialogues are converted to chat messages here, by the tests' own code, in both
TRL preference forms (explicit and implicit prompt) and the scored form; expected token ids come from
ChatML strings built from the raw HH text with plain string replacement (an independent path).
"""

import gzip
import json
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxppo.config.schema import DataConfig
from jaxppo.data.conversation import Message, render, split_implicit
from jaxppo.data.pipeline import rows_from_records, tokenize_rows
from jaxppo.data.report import SKIP_REASONS, DataError, DataReport
from jaxppo.data.tokenize import tokenize_preference, tokenize_scored
from jaxppo.data.validation import validate_preference, validate_scored

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def hh_messages(text: str) -> list[dict]:
    """An HH-RLHF dialogue string as chat messages (Human -> user, Assistant -> assistant, contents stripped)."""
    parts = re.split(r"\n\n(Human|Assistant):", text)
    assert parts[0] == ""
    return [{"role": "user" if r == "Human" else "assistant", "content": c.strip()}
            for r, c in zip(parts[1::2], parts[2::2])]


def hh_chatml(text: str) -> str:
    """The ChatML rendering of an HH dialogue by string replacement (no message objects involved)."""
    parts = re.split(r"\n\n(Human|Assistant):", text)
    return "".join(f"<|im_start|>{'user' if r == 'Human' else 'assistant'}\n{c.strip()}<|im_end|>\n"
                   for r, c in zip(parts[1::2], parts[2::2]))


@pytest.fixture(scope="module")
def hh_rows(shared_dir):
    with gzip.open(shared_dir / "data" / "hh-rlhf" / "harmless-base-test.jsonl.gz", "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


@pytest.fixture(scope="module")
def multi_turn(hh_rows):
    """The first 12 HH rows with at least 3 human turns whose messages are all non-empty."""
    out = []
    for r in hh_rows:
        c, j = hh_messages(r["chosen"]), hh_messages(r["rejected"])
        if sum(m["role"] == "user" for m in c) >= 3 and all(m["content"] for m in c + j) and c[:-1] == j[:-1]:
            out.append(r)
        if len(out) == 12:
            return out


def explicit(r):
    c, j = hh_messages(r["chosen"]), hh_messages(r["rejected"])
    return {"prompt": c[:-1], "chosen": c[-1:], "rejected": j[-1:]}


def implicit(r):
    return {"chosen": hh_messages(r["chosen"]), "rejected": hh_messages(r["rejected"])}


@pytest.fixture
def chatml_tok(stories_tokenizer):
    stories_tokenizer.chat_template = CHATML
    return stories_tokenizer


def _ids(tok, text):
    return tok([text], add_special_tokens=False)["input_ids"][0]


# ----------------------------------------------------------------------------- validation

U, A, S = ({"role": r, "content": c} for r, c in (("user", "hi"), ("assistant", "yo"), ("system", "be kind")))


@pytest.mark.parametrize("bad,reason,needle", [
    ({"prompt": 3, "response": [A]}, "not_a_string", "'prompt' must be a string or a list of chat messages, got int"),
    ({"prompt": [], "response": [A]}, "empty_conversation", "'prompt' is an empty list"),
    ({"prompt": [U], "response": []}, "empty_conversation", "'response' is an empty list"),
    ({"prompt": [{"content": "x"}], "response": [A]}, "bad_message", "'prompt'[0] has no role"),
    ({"prompt": [{"role": "user"}], "response": [A]}, "bad_message", "'prompt'[0] has no content"),
    ({"prompt": ["hi"], "response": [A]}, "bad_message", "'prompt'[0] is a str"),
    ({"prompt": [{"role": "user", "content": 4}], "response": [A]}, "bad_message", "content must be a string"),
    ({"prompt": [{"role": "human", "content": "x"}], "response": [A]}, "unknown_role", "role 'human'"),
    ({"prompt": [U, {"role": "user", "content": "  "}], "response": [A]}, "empty_text", "'prompt'[1] content is empty"),
    ({"prompt": [U, A], "response": [A]}, "prompt_not_user_last", "ends with a 'assistant' turn"),
    ({"prompt": [S], "response": [A]}, "prompt_not_user_last", "ends with a 'system' turn"),
    ({"prompt": [U], "response": [U]}, "response_not_assistant", "'response'[0] is a 'user' turn"),
    ({"prompt": "hi", "response": [A]}, "mixed_text_and_messages", "'prompt' is a string"),
    ({"prompt": [U], "completion": [A, U]}, "response_not_assistant", "'completion'[1]"),
    ({"prompt": [U], "response": [A], "label": "yes"}, "bad_score", "'label' must be a boolean"),
])
def test_each_bad_conversational_scored_row_is_counted(bad, reason, needle):
    rep = DataReport()
    good = {"prompt": [S, U], "response": [A], "score": 0.5}
    rows = validate_scored([good, {"score": 1.0, **bad} if "label" not in bad else bad], report=rep)
    assert len(rows) == 1 and rows[0].prompt == (Message("system", "be kind"), Message("user", "hi"))
    assert rep.skipped == {reason: 1} and reason in SKIP_REASONS
    assert needle in rep.examples[reason][0] and rep.examples[reason][0].startswith("row 1:")


def test_scored_forms_completion_label_and_string_response():
    rows = validate_scored([
        {"prompt": [U], "completion": [A], "label": True},
        {"prompt": [U], "response": "ok", "label": False},
        {"prompt": [U], "response": [A, A], "label": True, "score": -2.0},  # score wins over label
    ])
    assert [r.score for r in rows] == [1.0, 0.0, -2.0]
    assert rows[0].response == (Message("assistant", "yo"),)
    assert rows[1].response == (Message("assistant", "ok"),)  # a string after chat messages = one assistant turn
    assert len(rows[2].response) == 2
    # prompts are hashable: groups and by-prompt splits key on them
    assert len({rows[0].prompt, rows[1].prompt}) == 1


@pytest.mark.parametrize("bad,reason", [
    ({"chosen": [U, A], "rejected": [U, {"role": "assistant", "content": "no"}, U]}, "response_not_assistant"),
    ({"chosen": [U, A], "rejected": [{"role": "user", "content": "other"}, A]}, "conversation_mismatch"),
    ({"chosen": [A], "rejected": [{"role": "assistant", "content": "b"}]}, "empty_conversation"),
    ({"chosen": [S, A], "rejected": [S, {"role": "assistant", "content": "b"}]}, "prompt_not_user_last"),
    ({"chosen": [U, A], "rejected": "\n\nHuman: hi\n\nAssistant: b"}, "mixed_text_and_messages"),
    ({"chosen": [U, A], "rejected": [U, A]}, "identical_pair"),
    ({"prompt": [U], "chosen": [U], "rejected": [A]}, "response_not_assistant"),
    ({"prompt": "hi", "chosen": [A], "rejected": "b"}, "mixed_text_and_messages"),
    ({"prompt": [U], "chosen": 7, "rejected": [A]}, "not_a_string"),
])
def test_each_bad_preference_row_is_counted(bad, reason):
    rep = DataReport()
    good = {"chosen": [U, A], "rejected": [U, {"role": "assistant", "content": "no"}]}
    rows = validate_preference([good, bad], report=rep)
    assert len(rows) == 1 and rep.skipped == {reason: 1}


def test_split_implicit_by_hand():
    c = (Message("system", "s"), Message("user", "q"), Message("assistant", "a1"), Message("user", "q2"),
         Message("assistant", "good"))
    j = c[:-1] + (Message("assistant", "bad"),)
    assert split_implicit(c, j) == (c[:-1], c[-1:], j[-1:])


# ----------------------------------------------------------------------------- rendering

def test_render_multi_turn_by_hand(chatml_tok):
    prompt = (Message("system", "Be brief."), Message("user", "Hi"), Message("assistant", "Hello"),
              Message("user", "Name a color"))
    p, r = render(chatml_tok, prompt, (Message("assistant", "Red"),))
    assert p == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                 "<|im_start|>assistant\nHello<|im_end|>\n<|im_start|>user\nName a color<|im_end|>\n"
                 "<|im_start|>assistant\n")
    # stories260K's EOS is </s>, not <|im_end|>: the template's newline stays
    assert r == "Red<|im_end|>\n"
    _, r2 = render(chatml_tok, prompt, (Message("assistant", "Red"), Message("assistant", "Blue")))
    assert r2 == "Red<|im_end|>\n<|im_start|>assistant\nBlue<|im_end|>\n"


def test_trailing_whitespace_after_eos_is_cut(chatml_tok):
    chatml_tok.eos_token = "<|im_end|>"  # as in ChatML models (SmolLM2, Qwen2)
    _, r = render(chatml_tok, (Message("user", "Hi"),), (Message("assistant", "Yes"),))
    assert r == "Yes<|im_end|>"


class _Tok:
    """A tokenizer stub whose template renders the last user turn differently inside a longer conversation."""

    chat_template = "x"
    eos_token = None

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        last = len(messages) - 1
        text = "".join(f"[{m['role']}{'!' if i == last and m['role'] == 'user' else ''}]{m['content']}"
                       for i, m in enumerate(messages))
        return text + ("[bot]" if add_generation_prompt else "")


def test_template_mismatch_is_a_counted_skip():
    rep = DataReport()
    rows = validate_scored([{"prompt": [U], "response": [A], "score": 1.0}], report=rep)
    out = tokenize_scored(rows, _Tok(), max_prompt_length=8, max_response_length=8, report=rep)
    assert len(out["index"]) == 0 and rep.skipped == {"template_mismatch": 1}
    assert "differ from character 5: '!]hi' vs ']hi[assistant]yo'" in rep.examples["template_mismatch"][0]


R1_LIKE = CHATML.replace("'<|im_start|>assistant\\n'", "'<|im_start|>assistant\\n<think>\\n'")


def test_generation_prompt_with_extra_text_renders_by_the_common_prefix(chatml_tok):
    """DeepSeek-R1 style: the generation prompt adds "<think>\n", which a rendered assistant turn does not start
    with. As TRL, the prompt is the common prefix of the generation prompt and each rendered conversation; the
    row renders (it used to be skipped as template_mismatch) and both answers of a pair share one prompt."""
    assert "<think>" in R1_LIKE
    chatml_tok.chat_template = R1_LIKE
    prompt = (Message("user", "Name a color"),)
    p, good, bad = render(chatml_tok, prompt, (Message("assistant", "Red"),), (Message("assistant", "Blue"),))
    assert p == "<|im_start|>user\nName a color<|im_end|>\n<|im_start|>assistant\n"
    assert (good, bad) == ("Red<|im_end|>\n", "Blue<|im_end|>\n")
    rep = DataReport()
    rows = validate_preference([{"prompt": [U], "chosen": [A], "rejected": [{"role": "assistant", "content": "no"}]}],
                               report=rep)
    out = tokenize_preference(rows, chatml_tok, max_prompt_length=96, max_response_length=32, report=rep)
    assert len(out["index"]) == 1 and not rep.skipped
    assert out["prompt_ids"][0][out["prompt_mask"][0] > 0].tolist() == _ids(
        chatml_tok, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_empty_system_message_renders():
    """An empty system message is kept and rendered (TRL renders it); it used to drop the row as empty_text."""
    rep = DataReport()
    rows = validate_scored([{"prompt": [{"role": "system", "content": ""}, U], "response": [A], "score": 1.0}],
                           report=rep)
    assert not rep.skipped and rows[0].prompt == (Message("system", ""), Message("user", "hi"))
    p, r = render(_ChatML(), rows[0].prompt, rows[0].response)
    assert p == "<|im_start|>system\n<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert r == "yo<|im_end|>\n"


class _ChatML:
    """ChatML by string formatting (no Jinja), an independent renderer."""

    chat_template = "chatml"
    eos_token = None

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def test_no_chat_template_is_a_clear_error(stories_tokenizer):
    stories_tokenizer.chat_template = None
    rows = validate_scored([{"prompt": [U], "response": [A], "score": 1.0}])
    with pytest.raises(DataError, match="no chat template.*data.chat_template_file"):
        tokenize_scored(rows, stories_tokenizer, max_prompt_length=8, max_response_length=8)


def test_chat_template_file_is_applied(tmp_path, stories_tokenizer, hh_rows):
    stories_tokenizer.chat_template = None
    (tmp_path / "chatml.jinja").write_text(CHATML)
    cfg = DataConfig(schema="preference", chat_template_file=str(tmp_path / "chatml.jinja"), max_prompt_length=1024,
                     max_response_length=256)
    loaded = rows_from_records([explicit(hh_rows[0])], cfg)
    arrays = tokenize_rows(loaded, stories_tokenizer, cfg)
    assert stories_tokenizer.chat_template == CHATML and len(arrays["index"]) == 1
    with pytest.raises(DataError, match="chat_template_file .*nope.jinja is not a file"):
        tokenize_rows(loaded, stories_tokenizer, DataConfig(schema="preference", chat_template_file="nope.jinja"))


_content = st.text(alphabet="abc xyz.?", min_size=1, max_size=8).filter(str.strip)


@pytest.fixture(scope="module")
def chatml_module_tok(shared_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(shared_dir / "models" / "stories260K"))
    tok.chat_template = CHATML
    return tok


@given(turns=st.lists(_content, min_size=1, max_size=4), good=_content, bad=_content, system=st.booleans())
def test_rendered_prompt_plus_response_is_the_whole_conversation(chatml_module_tok, turns, good, bad, system):
    """For alternating user/assistant turns: prompt + response == the full rendering (== ChatML built by
    hand), and the explicit and implicit forms give the same pair."""
    tok = chatml_module_tok
    msgs = ([{"role": "system", "content": "sys"}] if system else []) + [
        {"role": "user" if k % 2 == 0 else "assistant", "content": c} for k, c in enumerate(turns)]
    if msgs[-1]["role"] != "user":
        msgs.append({"role": "user", "content": "q"})
    c = msgs + [{"role": "assistant", "content": good}]
    j = msgs + [{"role": "assistant", "content": bad + "!"}]
    (pe,) = validate_preference([{"prompt": msgs, "chosen": c[-1:], "rejected": j[-1:]}])
    (pi,) = validate_preference([{"chosen": c, "rejected": j}])
    assert (pe.prompt, pe.chosen, pe.rejected) == (pi.prompt, pi.chosen, pi.rejected)
    p_text, r_text = render(tok, pe.prompt, pe.chosen)
    want = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in c)
    assert p_text + r_text == tok.apply_chat_template(c, tokenize=False) == want
    assert p_text.endswith("<|im_start|>assistant\n") and r_text == good + "<|im_end|>\n"


# ----------------------------------------------------------------------------- real HH dialogues

def test_hh_as_conversations_keeps_and_skips_the_same_rows(hh_rows):
    """All 2,312 rows: the implicit conversational form skips the 5 mismatched pairs of the string form
    (as conversation_mismatch) plus the 4 rows with an empty turn, and nothing else."""
    rep_s, rep_c = DataReport(), DataReport()
    s = validate_preference(hh_rows, report=rep_s)
    c = validate_preference([implicit(r) for r in hh_rows], report=rep_c)
    assert rep_s.skipped == {"prompt_mismatch": 5}
    assert rep_c.skipped == {"conversation_mismatch": 5, "empty_text": 4}
    assert {p.index for p in c} <= {p.index for p in s} and len(c) == len(s) - 4
    assert rep_c.rows_seen == len(hh_rows) == 2312


def test_hh_explicit_and_implicit_forms_tokenize_to_the_chatml_of_the_raw_text(multi_turn, chatml_tok):
    kw = dict(max_prompt_length=2048, max_response_length=512, truncation="error")
    pe = validate_preference([explicit(r) for r in multi_turn])
    pi = validate_preference([implicit(r) for r in multi_turn])
    assert len(pe) == len(pi) == 12
    ae, ai = tokenize_preference(pe, chatml_tok, **kw), tokenize_preference(pi, chatml_tok, **kw)
    for k in ae:
        np.testing.assert_array_equal(ae[k], ai[k], err_msg=k)
    for n, r in enumerate(multi_turn):
        full_c, full_r = hh_chatml(r["chosen"]), hh_chatml(r["rejected"])
        cut = full_c.rindex("<|im_start|>assistant\n") + len("<|im_start|>assistant\n")
        assert full_c[:cut] == full_r[:cut]
        want_p = _ids(chatml_tok, full_c[:cut])
        assert ae["prompt_ids"][n][ae["prompt_mask"][n] == 1].tolist() == want_p
        assert ae["chosen_ids"][n][ae["chosen_mask"][n] == 1].tolist() == _ids(chatml_tok, full_c[cut:])
        assert ae["rejected_ids"][n][ae["rejected_mask"][n] == 1].tolist() == _ids(chatml_tok, full_r[cut:])
    # the scored form (TRL prompt/completion, labels) of the same dialogues: chosen and rejected rows
    scored = [{"prompt": explicit(r)["prompt"], "completion": explicit(r)[k], "label": k == "chosen", "group_id": n}
              for n, r in enumerate(multi_turn) for k in ("chosen", "rejected")]
    a = tokenize_scored(validate_scored(scored), chatml_tok, **kw)
    np.testing.assert_array_equal(a["prompt_ids"][0::2], ae["prompt_ids"])
    np.testing.assert_array_equal(a["response_ids"][0::2], ae["chosen_ids"])
    np.testing.assert_array_equal(a["response_ids"][1::2], ae["rejected_ids"])
    assert a["score"].tolist() == [1.0, 0.0] * 12 and a["group_id"].tolist() == np.repeat(np.arange(12), 2).tolist()


# ----------------------------------------------------------------------------- SmolLM2's real template

@pytest.fixture(scope="module")
def smollm2_tok():
    from jaxppo.hf.paths import resolve_model_path
    from jaxppo.hf import load_tokenizer

    return load_tokenizer(resolve_model_path("smollm2"))


SMOL_SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"


def test_smollm2_template_on_hh_pairs_for_reward_models_and_dpo(multi_turn, smollm2_tok):
    tok = smollm2_tok
    assert tok.eos_token == "<|im_end|>"
    pairs = validate_preference([implicit(r) for r in multi_turn[:4]])
    a = tokenize_preference(pairs, tok, max_prompt_length=1024, max_response_length=256, truncation="error")
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    for n, r in enumerate(multi_turn[:4]):
        full_c = hh_chatml(r["chosen"])
        cut = full_c.rindex("<|im_start|>assistant\n") + len("<|im_start|>assistant\n")
        # SmolLM2's template adds its default system turn when the conversation has none
        assert a["prompt_ids"][n][a["prompt_mask"][n] == 1].tolist() == _ids(tok, SMOL_SYSTEM + full_c[:cut])
        c = a["chosen_ids"][n][a["chosen_mask"][n] == 1].tolist()
        assert c == _ids(tok, full_c[cut:].rstrip("\n")) and c[-1] == eos  # the human answer ends with EOS
        assert a["rejected_ids"][n][a["rejected_mask"][n] == 1].tolist()[-1] == eos


def test_collect_prompt_file_accepts_chat_messages(tmp_path, smollm2_tok):
    from jaxppo.cli.collect import read_prompts
    from jaxppo.data.tokenize import encode_prompts

    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt": [U, A, {"role": "user", "content": "more"}]}) + "\n"
                 + json.dumps({"prompt": [{"role": "user", "content": "x"}]}) + "\n")
    prompts = read_prompts(str(f))
    assert prompts[1] == (Message("user", "x"),)
    ids = encode_prompts(smollm2_tok, prompts)
    assert ids[1] == _ids(smollm2_tok, SMOL_SYSTEM + "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n")
    for lines, msg in [([{"prompt": [U, A]}], "line 1: 'prompt' ends with a 'assistant' turn"),
                       ([{"prompt": [{"role": "bot", "content": "x"}]}], "unknown_role"),
                       ([{"prompt": [U]}, {"prompt": "text"}], "mixes plain-text prompts and chat-message prompts"),
                       ([{"prompt": 3}], "non-empty 'prompt' string or a list of chat messages")]:
        f.write_text("".join(json.dumps(x) + "\n" for x in lines))
        with pytest.raises(DataError, match=re.escape(msg)):
            read_prompts(str(f))
