"""``swarm-node eval``: scores as the node's own evaluation does, loads checkpoints (full and adapter), bad input."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from node.cli.main import main
from node.core import checkpoint
from node.core.state import FORMAT
from node.tasks.registry import build_task
from node.training import evaluate as evaluate_module
from node.training.adapters import SHARED_BASE_SEED, AdapterConfig, adapter_identity, attach_adapter, trainable_state
from node.training.device import params_digest
from node.training.evaluate import EvalConfig, EvalResult, eval_sets, evaluate
from node.training.models import load_model
from node.training.policy import GenerationConfig, Policy

ITEMS, SAMPLES = 16, 2
EVAL_FLAGS = ["--task", "max", "--items", str(ITEMS), "--samples", str(SAMPLES), "--device", "cpu", "--json"]


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    """Run ``swarm-node eval`` and parse its one JSON object (stdout holds nothing else)."""
    assert main(["eval", *argv]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def scored_digests(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The weights' digest of every policy the command scores (it imports ``evaluate`` when it runs)."""
    seen: list[str] = []

    def spy(policy: Policy, *args: Any, **kwargs: Any) -> EvalResult:
        seen.append(params_digest(policy.model))
        return evaluate(policy, *args, **kwargs)

    monkeypatch.setattr(evaluate_module, "evaluate", spy)
    return seen


def direct(policy: Policy) -> EvalResult:
    """What the node's evaluation gives for ``policy`` with the command's settings (EVAL_FLAGS, defaults)."""
    families = {"max": build_task("max")}
    cfg = EvalConfig(eval_items=ITEMS, eval_samples=SAMPLES, eval_timeout_s=600.0)
    return evaluate(policy, families, eval_sets(families, ITEMS), GenerationConfig(1.0, 1.0, 1), cfg)


def train(policy: Policy, steps: int = 60) -> None:
    """A few supervised steps on ``max`` (question -> gold answer): weights a node could have learned."""
    family = build_task("max")
    params = [p for p in policy.model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(params, lr=3e-3)
    for step in range(steps):
        items = [family.item(1, step * 32 + i) for i in range(32)]
        logp, mask = policy.token_logprobs([it.prompt for it in items], [it.answer for it in items])
        loss = -logp.sum() / mask.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


def node_state(policy: Policy) -> dict[str, Any]:
    """A checkpoint state as :func:`node.core.state.capture` writes it (every key :func:`restore` reads)."""
    model = policy.model
    identity = adapter_identity(model)
    params = [p for p in model.parameters() if p.requires_grad]
    return {
        "format": FORMAT,
        "peer": "12D3KooWTestPeer",
        "model_id": policy.model_id,
        "round": 7,
        "adapter": identity,
        "model": model.state_dict() if identity is None else trainable_state(model),
        "optimizer": torch.optim.AdamW(params).state_dict(),
        "sync": None,
        "rng": random.Random(0).getstate(),
        "learned": {"baseline": {}, "publishers": {}, "models": {}},
    }


@pytest.fixture(scope="module")
def trained() -> Policy:
    model, tokenizer, model_id = load_model("tiny-s", seed=0, device="cpu")
    policy = Policy(model, tokenizer, model_id)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # module-scoped: set up before the autouse one_thread
    try:
        train(policy)
    finally:
        torch.set_num_threads(threads)
    return policy


def test_json_output(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, "--model", "tiny-s", "--task", "max", "--items", "8", "--samples", "2", "--json")
    assert 0.0 <= out["accuracy"] <= 1.0 and out["items"] == 8 and out["complete"]
    assert out["questions"] == {"max": 8} and out["checkpoint"] is None and 0.0 <= out["sample_reward"] <= 1.0


def test_table_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "--task", "max", "--task", "parity", "--items", "4", "--samples", "0", "--device", "cpu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("held-out evaluation of tiny-s") and "accuracy" in lines[1]
    assert [line.split()[:2] for line in lines[2:5]] == [["max", "4"], ["parity", "4"], ["total", "8"]]
    assert not any("sampled reward" in line for line in lines)  # --samples 0: greedy only


def test_checkpoint_round_trip(
    trained: Policy, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    file = checkpoint.save(tmp_path / "runs" / "abc123", node_state(trained))
    expected = direct(trained)
    digests = scored_digests(monkeypatch)
    untrained = run_json(capsys, *EVAL_FLAGS)
    # the file, the node's run folder and a log folder holding that one run all load the same weights
    for given in (file, file.parent, tmp_path / "runs"):
        got = run_json(capsys, *EVAL_FLAGS, "--checkpoint", str(given))
        assert (got["accuracy"], got["sample_reward"]) == (expected.accuracy, expected.sample_reward)
        assert got["checkpoint"] == str(file) and got["round"] == 7
    assert digests[1:] == [params_digest(trained.model)] * 3 and digests[0] != digests[1]
    assert expected.accuracy > untrained["accuracy"]  # the training above taught it something


def test_adapter_checkpoint_round_trip(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    model, tokenizer, model_id = load_model("tiny-s", seed=SHARED_BASE_SEED, device="cpu")
    policy = Policy(
        attach_adapter(model, AdapterConfig("lora", lora_rank=4, lora_alpha=8), seed=5), tokenizer, model_id
    )
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        for p in policy.model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.5)  # lora_B starts at zero: make the adapter change the model
    file = checkpoint.save(tmp_path, node_state(policy))
    digests = scored_digests(monkeypatch)
    # --seed does not matter: an adapter node's base is the shared init
    got = run_json(capsys, *EVAL_FLAGS, "--seed", "3", "--checkpoint", str(file))
    expected = direct(policy)
    assert (got["accuracy"], got["sample_reward"]) == (expected.accuracy, expected.sample_reward)
    assert digests == [params_digest(policy.model)]


def test_adapter_on_another_base_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model, tokenizer, model_id = load_model("tiny-s", seed=SHARED_BASE_SEED + 1, device="cpu")
    policy = Policy(
        attach_adapter(model, AdapterConfig("lora", lora_rank=4, lora_alpha=8), seed=0), tokenizer, model_id
    )
    file = checkpoint.save(tmp_path, node_state(policy))
    assert main(["eval", *EVAL_FLAGS, "--checkpoint", str(file)]) == 2
    err = capsys.readouterr().err
    assert "--checkpoint" in err and "another base" in err and len(err.strip().splitlines()) == 1


def test_checkpoint_of_another_model_names_the_fix(
    trained: Policy, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = checkpoint.save(tmp_path, node_state(trained))
    assert main(["eval", *EVAL_FLAGS, "--model", "tiny-gpt2", "--checkpoint", str(file)]) == 2
    err = capsys.readouterr().err
    assert "is of model tiny-s" in err and "--model tiny-s" in err and len(err.strip().splitlines()) == 1


def bad_checkpoints(tmp_path: Path) -> dict[str, Path]:
    """A folder without a checkpoint and a file that is not one."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "garbage.pt").write_bytes(b"not a checkpoint")
    return {"empty": tmp_path / "empty", "garbage": tmp_path / "garbage.pt"}


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--task", "nosuch"], "--task nosuch"),
        (["--checkpoint", "/nonexistent"], "--checkpoint /nonexistent"),
        (["--items", "0"], "--items 0"),
        (["--samples", "65"], "--samples 65"),
        (["--timeout", "0"], "--timeout 0"),
        (["--model", "no-such-model"], "--model no-such-model"),
        (["--checkpoint", "{empty}"], "holds no checkpoint.pt"),
        (["--checkpoint", "{garbage}"], "not an intact checkpoint"),
    ],
)
def test_bad_input_is_one_sentence(
    argv: list[str], words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = bad_checkpoints(tmp_path)
    argv = [a.format(**paths) for a in argv]
    assert main(["eval", "--task", "max", "--items", "2", "--samples", "0", *argv]) == 2
    captured = capsys.readouterr()
    err = captured.err
    assert err.startswith("swarm-node: error: ") and words in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and captured.out == ""


@pytest.mark.process
def test_bad_input_fails_before_torch_is_imported() -> None:
    code = (
        "import sys\nfrom node.cli.main import main\n"
        "bad = (['--items', '0'], ['--task', 'nosuch'], ['--checkpoint', '/nonexistent'])\n"
        "codes = [main(['eval', *a]) for a in bad]\n"
        "print(codes, 'torch' in sys.modules)"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert res.stdout.strip() == "[2, 2, 2] False", res.stderr
