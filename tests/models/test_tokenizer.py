"""lit_rl/models/tokenizer.py: the tiny models' character tokenizer built in code."""

from __future__ import annotations

from lit_rl.models.tokenizer import build_char_tokenizer


def test_the_char_tokenizers_ids_by_hand():
    # ids: 5 special tokens, 4 format tags, then string.printable without \x0b \x0c \r (97 characters):
    # digits at 9.., letters at 19.., punctuation at 71.., then " " 103, "\t" 104, "\n" 105
    tok = build_char_tokenizer()
    assert len(tok) == 106
    assert (tok.pad_token_id, tok.mask_token_id, tok.eos_token_id, tok.bos_token_id) == (0, 2, 3, 4)
    ids = tok("<answer>12</answer> a\n", add_special_tokens=False)["input_ids"]
    assert ids == [7, 10, 11, 8, 103, 19, 105]  # a format tag is one token
    assert tok("é\r", add_special_tokens=False)["input_ids"] == [1, 1]  # [UNK]
    assert tok.decode(tok("<reasoning>x y</reasoning>")["input_ids"]) == "<reasoning>x y</reasoning>"
    padded = tok(["ab", "abcd"], padding=True, add_special_tokens=False)
    assert padded["input_ids"] == [[0, 0, 19, 20], [19, 20, 21, 22]]  # padded on the left
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U v"}]
    assert tok.apply_chat_template(messages, tokenize=False) == "S\nU v\n"
