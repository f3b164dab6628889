"""A character-level tokenizer built in code, as a real Hugging Face fast tokenizer.

Tiny built-in models need no downloaded files: every printable ASCII character,
space and newline is one token. The result is a ``PreTrainedTokenizerFast``, so
the policy code treats it exactly like the tokenizer of any local HF model, and
``save_pretrained`` / ``AutoTokenizer.from_pretrained`` round-trip it.

>>> tok = char_tokenizer()
>>> tok.decode(tok("max 3941=", add_special_tokens=False)["input_ids"])
'max 3941='
"""

from __future__ import annotations

import logging
import string
from typing import TYPE_CHECKING, Any

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

logger = logging.getLogger(__name__)

PAD, EOS, BOS, UNK = "<pad>", "<eos>", "<bos>", "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, EOS, BOS, UNK)
"""Special tokens, in id order: pad=0, eos=1, bos=2, unk=3."""

CHARACTERS: str = string.digits + string.ascii_letters + string.punctuation + " \n"
"""The fixed character vocabulary (after the special tokens); any other character maps to unk."""


def char_vocab() -> dict[str, int]:
    """The token -> id map: special tokens first, then :data:`CHARACTERS` in order."""
    tokens = list(SPECIAL_TOKENS) + list(CHARACTERS)
    return {tok: i for i, tok in enumerate(tokens)}


def char_tokenizer() -> PreTrainedTokenizerFast:
    """Build the character-level tokenizer.

    Each character is one token (a regex pre-tokenizer isolates every character,
    newlines included); decoding concatenates tokens without separators. Encoding
    with ``add_special_tokens=True`` prepends ``<bos>``; ``<eos>`` is never added
    automatically (the policy appends it where a completion ends).
    """
    from transformers import PreTrainedTokenizerFast  # seconds to import: only when a tokenizer is built

    vocab = char_vocab()
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A",
        pair=f"{BOS} $A $B",
        special_tokens=[(BOS, vocab[BOS])],
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        eos_token=EOS,
        bos_token=BOS,
        unk_token=UNK,
        padding_side="left",
        clean_up_tokenization_spaces=False,
        model_max_length=1024,
    )
    logger.debug("built character tokenizer with %d tokens", len(vocab))
    return tok


def max_token_chars(tokenizer: Any) -> int:
    """The most characters one token can decode to: the longest vocabulary entry, special tokens excluded.

    Text of n tokens has at most ``n * max_token_chars`` characters, so a
    longer text is over an n-token budget without being tokenised (the
    acceptance policy's character pre-check). The entry's length is an upper
    bound of its decoded length for the common vocabularies: one character per
    byte in byte-level BPE (GPT-2, SmolLM2: 81), ``\u2581`` for a space in
    SentencePiece, ``<0x0A>`` for one byte of fallback; 1 for
    :func:`char_tokenizer`.
    """
    special = set(getattr(tokenizer, "all_special_tokens", ()))
    longest = max((len(tok) for tok in tokenizer.get_vocab() if tok not in special), default=1)
    return max(1, longest)
