"""``swarm-node export``: the folder loads with plain transformers and scores as the node does; bad input.

A checkpoint is written by the node's own code (:func:`node.core.state.capture` of a policy, its
trainer and credit, then :func:`node.core.checkpoint.save`); the exported folder is loaded with
``AutoModelForCausalLM`` and ``AutoTokenizer`` only and compared with the node's policy: the same
token ids, the same logits within float tolerance, the same greedy held-out accuracy through the
node's evaluation (:func:`node.training.evaluate.evaluate`).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from node.cli.main import main
from node.core import checkpoint
from node.core.credit import SourceCredit
from node.core.links import Sync
from node.core.state import capture
from node.tasks.registry import build_task
from node.training.adapters import SHARED_BASE_SEED, AdapterConfig, attach_adapter
from node.training.evaluate import EvalConfig, EvalResult, eval_sets, evaluate
from node.training.export import BASE_FOLDER, PROVENANCE_FILE, save_tokenizer
from node.training.grpo import GRPOTrainer
from node.training.models import load_model
from node.training.policy import GenerationConfig, Policy
from node.training.share import ShareControl
from node.training.tokenizer import char_tokenizer

PEER = "12D3KooWExportTestPeer"
PROMPTS = ["max 3941=", "parity 1011=", "a longer prompt, with ~ odd chars: é and\nnewlines"]


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@dataclass
class TrainedNode:
    """What a node's checkpoint captures (:class:`node.core.state.Checkpointable`), built from real parts."""

    policy: Policy
    run_dir: Path
    peer_id: str = PEER
    round: int = 12
    sync: Sync | None = None
    sampler_rng: random.Random = field(default_factory=lambda: random.Random(0))
    credit: SourceCredit = field(default_factory=SourceCredit)
    share: ShareControl = field(default_factory=lambda: ShareControl(4))
    trainer: GRPOTrainer = field(init=False)

    def __post_init__(self) -> None:
        self.trainer = GRPOTrainer(self.policy)

    def checkpoint(self) -> Path:
        """Write the node's checkpoint as a node does; returns its run folder."""
        checkpoint.save(self.run_dir, capture(self))
        return self.run_dir


def supervised(node: TrainedNode, steps: int) -> None:
    """A few steps on ``max`` (question -> gold answer) with the node's optimizer: weights a node could learn."""
    family = build_task("max")
    for step in range(steps):
        items = [family.item(1, step * 32 + i) for i in range(32)]
        logp, mask = node.policy.token_logprobs([it.prompt for it in items], [it.answer for it in items])
        loss = -logp.sum() / mask.sum()
        node.trainer.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        node.trainer.optimizer.step()


def perturb_adapter(policy: Policy, scale: float) -> None:
    """Move the adapter off its init (lora_B starts at zero, where the adapter changes nothing)."""
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        for p in policy.model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * scale)


def make_node(tmp_path: Path, model: str, lora: bool) -> TrainedNode:
    """A node of ``model`` whose weights moved away from their init (full fine-tuning or a LoRA adapter)."""
    net, tokenizer, model_id = load_model(model, seed=SHARED_BASE_SEED if lora else 3, device="cpu")
    if lora:
        net = attach_adapter(net, AdapterConfig("lora", lora_rank=4, lora_alpha=8), seed=5)
    node = TrainedNode(Policy(net, tokenizer, model_id), tmp_path / "logs" / "abc123")
    if lora:
        for group in node.trainer.optimizer.param_groups:
            group["lr"] = 1e-2  # low-rank adapters need about 10x full fine-tuning's rate
    supervised(node, 30)
    return node


def plain_load(folder: Path) -> tuple[Any, Any]:
    """The folder as a user loads it: transformers' Auto classes, nothing of swarm-node."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)


def last_logits(model: Any, tokenizer: Any, prompts: list[str]) -> tuple[list[list[int]], torch.Tensor]:
    """Each prompt's token ids and the logits after its last token (one prompt at a time: no padding)."""
    ids = [list(tokenizer(p)["input_ids"]) for p in prompts]
    with torch.no_grad():
        logits = torch.stack([model(input_ids=torch.tensor([row])).logits[0, -1].float() for row in ids])
    return ids, logits


def greedy_heldout(policy: Policy, tasks: tuple[str, ...], items: int, max_new_tokens: int) -> EvalResult:
    """The node's held-out evaluation, greedy answers only."""
    families = {name: build_task(name) for name in tasks}
    cfg = EvalConfig(eval_items=items, eval_samples=0, eval_timeout_s=3600.0)
    return evaluate(policy, families, eval_sets(families, items), GenerationConfig(1.0, 1.0, max_new_tokens), cfg)


def export(*argv: str) -> int:
    return main(["export", *argv])


def test_the_character_tokenizer_loads_with_plain_transformers(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    built = char_tokenizer()
    save_tokenizer(built, tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"
    for text in PROMPTS:
        assert loaded(text)["input_ids"] == built(text)["input_ids"]  # <bos> first, é as <unk>
        assert loaded(text, add_special_tokens=False)["input_ids"] == built(text, add_special_tokens=False)["input_ids"]
    ids = built("max 3941=")["input_ids"]
    assert loaded.decode(ids, skip_special_tokens=True) == "max 3941="
    special = ("pad_token_id", "eos_token_id", "bos_token_id", "unk_token_id", "padding_side")
    assert [getattr(loaded, k) for k in special] == [getattr(built, k) for k in special]
    assert len(loaded) == len(built) and loaded.get_vocab() == built.get_vocab()


@pytest.mark.parametrize(
    "model, lora, peft",
    [("tiny-s", False, False), ("tiny-s", True, False), ("tiny-gpt2", True, False), ("tiny-s", True, True)],
    ids=["full", "lora-merged", "gpt2-lora-merged", "lora-peft"],
)
def test_the_export_scores_as_the_node(
    model: str, lora: bool, peft: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node = make_node(tmp_path, model, lora)
    out = tmp_path / "exported"
    assert export(str(out), "--checkpoint", str(node.checkpoint()), *(["--peft"] if peft else [])) == 0
    assert f"exported {model} (round 12" in capsys.readouterr().out
    assert (out / "adapter_config.json").is_file() == peft and (out / BASE_FOLDER).is_dir() == peft
    exported, tokenizer = plain_load(out)
    ids, want = last_logits(node.policy.model, node.policy.tokenizer, PROMPTS)
    got_ids, got = last_logits(exported, tokenizer, PROMPTS)
    assert got_ids == ids
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)  # merging rounds: seen up to 7e-6
    base, _, _ = load_model(model, seed=SHARED_BASE_SEED if lora else 3, device="cpu")
    untrained = last_logits(base, node.policy.tokenizer, PROMPTS)[1]
    assert (untrained - want).abs().max() > 0.1  # what was exported is the trained model, not its init
    theirs = greedy_heldout(Policy(exported, tokenizer, model), ("max", "parity"), 32, 1)
    ours = greedy_heldout(node.policy, ("max", "parity"), 32, 1)
    assert (theirs.accuracy, theirs.per_family, theirs.items) == (ours.accuracy, ours.per_family, 64)
    assert ours.accuracy > 0.05  # the training taught it some answers: the equality is not of two zeros
    record = json.loads((out / PROVENANCE_FILE).read_text())
    assert (record["model"], record["round"], record["format"]) == (model, 12, "peft" if peft else "merged")
    assert record["checkpoint"] == str((node.run_dir / checkpoint.CURRENT).resolve())


def test_an_export_of_initial_weights_is_the_seeded_built_in(tmp_path: Path) -> None:
    assert export(str(tmp_path / "a"), "--model", "tiny-gpt2", "--seed", "4") == 0
    exported, tokenizer = plain_load(tmp_path / "a")
    built, _, _ = load_model("tiny-gpt2", seed=4, device="cpu")
    torch.testing.assert_close(last_logits(exported, tokenizer, PROMPTS)[1], last_logits(built, tokenizer, PROMPTS)[1])
    # an earlier export is replaced with --force, and only then
    assert export(str(tmp_path / "a"), "--model", "tiny-gpt2", "--seed", "5", "--force") == 0
    assert json.loads((tmp_path / "a" / PROVENANCE_FILE).read_text())["seed"] == 5
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left behind


def test_an_adapter_on_a_local_model_folder_refers_to_that_folder(tmp_path: Path) -> None:
    """A local base is not copied into a --peft export: the adapter names the folder it loads from."""
    base_folder = tmp_path / "base-model"
    assert export(str(base_folder), "--model", "tiny-s", "--seed", "2") == 0
    net, tokenizer, model_id = load_model(str(base_folder), seed=0, device="cpu")
    net = attach_adapter(net, AdapterConfig("lora", lora_rank=4, lora_alpha=8), seed=5)
    node = TrainedNode(Policy(net, tokenizer, model_id), tmp_path / "run")
    perturb_adapter(node.policy, 0.5)
    run = node.checkpoint()
    out = tmp_path / "adapter"
    assert export(str(out), "--checkpoint", str(run), "--model", str(base_folder), "--peft") == 0
    adapter = json.loads((out / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == str(base_folder.resolve()) and not (out / BASE_FOLDER).exists()
    exported, loaded = plain_load(out)
    want = last_logits(node.policy.model, tokenizer, PROMPTS)[1]
    torch.testing.assert_close(last_logits(exported, loaded, PROMPTS)[1], want, atol=1e-4, rtol=1e-4)


@pytest.mark.process
def test_the_folder_loads_and_answers_without_swarm_node(tmp_path: Path) -> None:
    """The docstring's lines, in a fresh interpreter: nothing of swarm-node is imported, the answer is the node's."""
    node = make_node(tmp_path, "tiny-s", lora=True)
    out = tmp_path / "exported"
    assert export(str(out), "--checkpoint", str(node.checkpoint())) == 0
    code = (
        "import json, sys\n"
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        f"tokenizer = AutoTokenizer.from_pretrained({str(out)!r})\n"
        f"model = AutoModelForCausalLM.from_pretrained({str(out)!r})\n"
        f"inputs = tokenizer({PROMPTS[0]!r}, return_tensors='pt')\n"
        "answer = model.generate(**inputs, max_new_tokens=1, do_sample=False)\n"
        "text = tokenizer.decode(answer[0, inputs['input_ids'].shape[1]:], skip_special_tokens=True)\n"
        "mine = sorted(m for m in sys.modules if m.split('.')[0] in ('node', 'swarm', 'protocol'))\n"
        "print(json.dumps([text, mine]))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    text, imported = json.loads(res.stdout.strip().splitlines()[-1])
    greedy = GenerationConfig(temperature=0.0, top_p=1.0, max_new_tokens=1)
    assert imported == [] and text == node.policy.generate([PROMPTS[0]], 1, greedy)[0][0]


def bad_inputs(tmp_path: Path) -> dict[str, Path]:
    """Paths the bad-input cases name: a file, a folder of other files, an earlier export, a full checkpoint."""
    (tmp_path / "file").write_text("x")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("keep me")
    (tmp_path / "earlier").mkdir()
    (tmp_path / "earlier" / PROVENANCE_FILE).write_text("{}")
    (tmp_path / "empty").mkdir()
    (tmp_path / "garbage.pt").write_bytes(b"not a checkpoint")
    return {
        "file": tmp_path / "file",
        "other": tmp_path / "other",
        "earlier": tmp_path / "earlier",
        "empty": tmp_path / "empty",
        "garbage": tmp_path / "garbage.pt",
        "new": tmp_path / "new",
    }


BAD = [
    (["{file}", "--model", "tiny-s"], "is a file; name a new folder"),
    (["{other}", "--model", "tiny-s"], "other files in it"),
    (["{other}", "--model", "tiny-s", "--force"], "other files in it"),  # --force never deletes a user's files
    (["{earlier}", "--model", "tiny-s"], "pass --force to replace it"),
    (["{new}"], "needs --checkpoint"),
    (["{new}", "--model", "tiny-s", "--peft"], "--peft saves a trained adapter"),
    (["{new}", "--checkpoint", "/nonexistent"], "--checkpoint /nonexistent: no such file"),
    (["{new}", "--checkpoint", "{empty}"], "holds no checkpoint.pt"),
    (["{new}", "--checkpoint", "{garbage}"], "not an intact checkpoint"),
    (["{new}", "--model", "no-such-model"], "--model no-such-model: unknown model"),
    (["{new}", "--model", "tiny-s", "--seed", "-1"], "--seed -1"),
    (["/proc/swarm-node-export-test"], "not a folder this user may write to"),
]


@pytest.mark.parametrize("argv, words", BAD)
def test_bad_input_is_one_sentence(
    argv: list[str], words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = bad_inputs(tmp_path)
    argv = [a.format(**paths) for a in argv]
    if argv[0] == "/proc/swarm-node-export-test":
        argv.append("--model=tiny-s")
    assert export(*argv) == 2
    captured = capsys.readouterr()
    err = captured.err
    assert err.startswith("swarm-node: error: ") and words in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1 and captured.out == ""
    assert (paths["other"] / "notes.txt").read_text() == "keep me" and not paths["new"].exists()


def test_a_checkpoint_that_does_not_fit_the_request_names_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    net, tokenizer, _ = load_model("tiny-s", seed=0, device="cpu")
    node = TrainedNode(Policy(net, tokenizer, "tiny-s"), tmp_path / "full")
    full = node.checkpoint()
    local = TrainedNode(Policy(net, tokenizer, "my-qwen"), tmp_path / "local").checkpoint()
    cases = [
        ([str(tmp_path / "a"), "--checkpoint", str(full), "--peft"], "holds fully fine-tuned weights"),
        ([str(tmp_path / "b"), "--checkpoint", str(local)], "local model 'my-qwen'; pass --model"),
        ([str(tmp_path / "c"), "--checkpoint", str(full), "--model", "tiny-gpt2"], "is of model tiny-s"),
    ]
    for argv, words in cases:
        assert export(*argv) == 2
        err = capsys.readouterr().err
        assert words in err and len(err.strip().splitlines()) == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full", "local"]


@pytest.mark.process
def test_bad_input_fails_before_torch_is_imported(tmp_path: Path) -> None:
    paths = bad_inputs(tmp_path)
    bad = [[a.format(**paths) for a in argv] for argv, _ in BAD[:8]]
    code = (
        "import sys\nfrom node.cli.main import main\n"
        f"codes = [main(['export', *a]) for a in {bad!r}]\n"
        "print(codes, 'torch' in sys.modules)"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert res.stdout.strip() == f"{[2] * len(bad)} False", res.stderr


@pytest.mark.slow
def test_smollm2_with_lora_exports_merged(tmp_path: Path) -> None:
    """SmolLM2-135M with a LoRA adapter: the merged folder gives the node's logits and greedy held-out answers."""
    from node.training.models import ModelPackageMissing

    try:
        net, tokenizer, model_id = load_model("smollm2-135m", seed=SHARED_BASE_SEED, device="cpu")
    except ModelPackageMissing as e:
        pytest.skip(str(e))
    net = attach_adapter(net, AdapterConfig("lora", lora_rank=8, lora_alpha=16), seed=5)
    node = TrainedNode(Policy(net, tokenizer, model_id), tmp_path / "logs" / "abc123")
    perturb_adapter(node.policy, 0.02)
    out = tmp_path / "exported"
    assert export(str(out), "--checkpoint", str(node.checkpoint())) == 0
    exported, loaded_tokenizer = plain_load(out)
    ids, want = last_logits(node.policy.model, tokenizer, PROMPTS)
    got_ids, got = last_logits(exported, loaded_tokenizer, PROMPTS)
    assert got_ids == ids and loaded_tokenizer.chat_template == tokenizer.chat_template
    torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-4)
    theirs = greedy_heldout(Policy(exported, loaded_tokenizer, model_id), ("rg:basic_arithmetic",), 6, 32)
    ours = greedy_heldout(node.policy, ("rg:basic_arithmetic",), 6, 32)
    assert (theirs.accuracy, theirs.items) == (ours.accuracy, 6)
