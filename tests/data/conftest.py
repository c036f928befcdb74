"""Fixtures of the data tests: a character-level tokenizer whose ids can be checked by hand."""

import pytest


class CharTokenizer:
    """Character-level tokenizer: id(c) = ord(c) - 94 for 'a'..'z' (a=3 ... z=28), ' ' = 29;
    BOS = 1 is prepended when ``add_special_tokens``; pad = 0, eos = 2."""

    pad_token_id = 0
    bos_token_id = 1
    eos_token_id = 2
    chat_template = None

    def __len__(self):
        return 30

    def encode_one(self, text):
        return [29 if c == " " else ord(c) - 94 for c in text if c == " " or "a" <= c <= "z"]

    def __call__(self, texts, add_special_tokens=True, verbose=True):
        ids = [([1] if add_special_tokens else []) + self.encode_one(t) for t in texts]
        return {"input_ids": ids}


@pytest.fixture
def char_tok():
    return CharTokenizer()


@pytest.fixture
def stories_tokenizer(shared_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(shared_dir / "models" / "stories260K"))
