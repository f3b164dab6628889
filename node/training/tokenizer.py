"""The built-in models' tokenizers, built in code as real Hugging Face fast tokenizers.

Tiny built-in models need no downloaded files. :func:`char_tokenizer` makes
every printable ASCII character, space and newline one token;
:func:`bpe_tokenizer` is a byte-pair encoding trained in code on the built-in
task families' prompts, so that a model that uses it splits the same text into
other tokens than a character model does (a mixed swarm exchanges text, and each
receiver re-tokenises it). Both are a ``PreTrainedTokenizerFast`` with the same
special tokens and ids, so the policy code treats them exactly like the
tokenizer of any local HF model, and ``save_pretrained`` /
``AutoTokenizer.from_pretrained`` round-trip them.

>>> tok = char_tokenizer()
>>> tok.decode(tok("max 3941=", add_special_tokens=False)["input_ids"])
'max 3941='
>>> bpe = bpe_tokenizer()
>>> bpe.decode(bpe("max 3941=", add_special_tokens=False)["input_ids"])
'max 3941='
"""

from __future__ import annotations

import functools
import logging
import random
import string
from typing import TYPE_CHECKING, Any

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

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
    vocab = char_vocab()
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    _prepend_bos(core)
    logger.debug("built character tokenizer with %d tokens", len(vocab))
    return _fast(core)


BPE_VOCAB_SIZE = 384
"""Tokens of :func:`bpe_tokenizer`: the special tokens, :data:`CHARACTERS`, and the rest merges."""

BPE_PIECES = r" ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s"
"""The pre-tokenizer's pieces (a space joins the run after it, as in GPT-2): merges never cross a piece,
so a number or a word becomes few tokens while letters, digits and punctuation stay apart."""

BPE_CORPUS_SEED = 0
"""The seed of the training corpus: every process trains the same vocabulary, so that nodes of the BPE model
share token ids (their weights average) and a saved model's tokenizer matches a freshly built one."""

BPE_CORPUS_PER_CONFIG = 100
"""Prompts per family and config value in the training corpus: enough for stable pair counts, few enough
that training takes a few tenths of a second."""


def bpe_corpus() -> list[str]:
    """The BPE training corpus: each built-in family's prompt followed by its answer, at every config value.

    Covering the whole range of every parameter (e.g. 2 to 12 digits) gives merges for short and long
    numbers alike; the text is a function of :data:`BPE_CORPUS_SEED` and the families' generators.
    """
    from node.tasks.builtin import BUILTIN_TASKS  # only when the tokenizer is trained: no task code at import

    rng = random.Random(BPE_CORPUS_SEED)
    texts: list[str] = []
    for cls in BUILTIN_TASKS.values():
        for key, (_default, lo, hi) in cls.params.items():
            for value in range(lo, hi + 1):
                family = cls({key: value})
                for _ in range(BPE_CORPUS_PER_CONFIG):
                    prompt, answer = family.generate(rng)
                    texts.append(prompt + answer)
    return texts


@functools.lru_cache(maxsize=1)
def _bpe_core_json() -> str:
    """The trained BPE tokenizer, serialised: trained once per process (a few tenths of a second)."""
    core = Tokenizer(models.BPE(unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(BPE_PIECES), behavior="isolated")
    # the vocabulary holds the text itself (no byte or word-boundary marks): joining tokens restores it
    core.decoder = decoders.Fuse()
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB_SIZE,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        # every character the character tokenizer knows is a token, so no text gets an unk here that it
        # would not get there; limit_alphabet keeps any other character of the corpus out
        initial_alphabet=list(CHARACTERS),
        limit_alphabet=len(CHARACTERS),
        show_progress=False,
    )
    core.train_from_iterator(bpe_corpus(), trainer=trainer)
    _prepend_bos(core)
    return core.to_str()


def bpe_tokenizer() -> PreTrainedTokenizerFast:
    """Build the byte-pair-encoding tokenizer (:data:`BPE_VOCAB_SIZE` tokens), deterministically.

    Special tokens and their ids, ``<bos>`` prepended with ``add_special_tokens=True`` and ``<eos>`` never
    added, left padding: as :func:`char_tokenizer`. Every character of :data:`CHARACTERS` is a token, so a
    one-character answer is one token; merges make ``max 3941=`` 4 tokens instead of 9 characters.
    Each call returns a new object (callers set attributes on it); the training runs once per process.
    """
    core = Tokenizer.from_str(_bpe_core_json())
    logger.debug("built BPE tokenizer with %d tokens", core.get_vocab_size())
    return _fast(core)


def _prepend_bos(core: Tokenizer) -> None:
    """Encoding with special tokens prepends ``<bos>``; ``<eos>`` is never added (the policy appends it)."""
    bos_id = core.token_to_id(BOS)
    if bos_id is None:
        raise ValueError(f"the tokenizer has no {BOS} token")
    core.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A",
        pair=f"{BOS} $A $B",
        special_tokens=[(BOS, bos_id)],
    )


def _fast(core: Tokenizer) -> PreTrainedTokenizerFast:
    """Wrap a core tokenizer as the fast tokenizer every built-in model uses (left padding, no clean-up)."""
    from transformers import PreTrainedTokenizerFast  # seconds to import: only when a tokenizer is built

    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        eos_token=EOS,
        bos_token=BOS,
        unk_token=UNK,
        padding_side="left",
        clean_up_tokenization_spaces=False,
        model_max_length=1024,
    )


def max_token_chars(tokenizer: Any) -> int:
    """The most characters one token can decode to: the longest vocabulary entry, special tokens excluded.

    Text of n tokens has at most ``n * max_token_chars`` characters, so a
    longer text is over an n-token budget without being tokenised (the
    acceptance policy's character pre-check). The entry's length is an upper
    bound of its decoded length for the common vocabularies: one character per
    byte in byte-level BPE (GPT-2, SmolLM2: 81), ``\u2581`` for a space in
    SentencePiece, ``<0x0A>`` for one byte of fallback; 1 for
    :func:`char_tokenizer`, the longest merge for :func:`bpe_tokenizer`.
    """
    special = set(getattr(tokenizer, "all_special_tokens", ()))
    longest = max((len(tok) for tok in tokenizer.get_vocab() if tok not in special), default=1)
    return max(1, longest)
