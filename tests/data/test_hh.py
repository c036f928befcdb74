from hypothesis import given
from hypothesis import strategies as st

from jaxppo.config.schema import DataConfig
from jaxppo.data.hh import ASSISTANT, split_dialogue, split_pair
from jaxppo.data.pipeline import load_rows


def test_split_at_the_last_assistant_turn():
    text = "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: how are you?\n\nAssistant: fine, thanks"
    assert split_dialogue(text) == ("\n\nHuman: hi\n\nAssistant: hello\n\nHuman: how are you?\n\nAssistant:",
                                    " fine, thanks")
    assert split_dialogue("\n\nHuman: no answer") is None
    assert split_dialogue("\n\nHuman: q\n\nAssistant:") == ("\n\nHuman: q\n\nAssistant:", "")


def test_split_pair():
    c = "\n\nHuman: q\n\nAssistant: good"
    r = "\n\nHuman: q\n\nAssistant: bad"
    assert split_pair(c, r) == ("\n\nHuman: q\n\nAssistant:", " good", " bad")
    reason, msg = split_pair(c, "\n\nHuman: Q\n\nAssistant: bad")
    assert reason == "prompt_mismatch" and "character 9" in msg
    assert split_pair("\n\nHuman: q", r)[0] == "no_assistant_turn"


turn = st.text(alphabet=st.characters(blacklist_characters="\n"), max_size=12)


@given(st.lists(st.tuples(turn, turn), min_size=1, max_size=4), turn)
def test_prompt_plus_response_is_the_dialogue(turns, last):
    text = "".join(f"\n\nHuman: {h}{ASSISTANT} {a}" for h, a in turns) + f"\n\nHuman: x{ASSISTANT}{last}"
    prompt, response = split_dialogue(text)
    assert prompt + response == text
    assert prompt.endswith(ASSISTANT) and ASSISTANT not in response


def test_shared_harmless_test_file_has_exactly_5_mismatched_prompts(shared_dir):
    path = shared_dir / "data" / "hh-rlhf" / "harmless-base-test.jsonl.gz"
    loaded = load_rows(DataConfig(path=str(path), schema="preference"))
    rep = loaded.report
    assert rep.rows_seen == 2312
    assert rep.skipped == {"prompt_mismatch": 5}
    assert rep.rows_kept == len(loaded.rows) == 2307
    for p in loaded.rows[:50]:
        assert p.prompt.endswith(ASSISTANT) and p.chosen != p.rejected
