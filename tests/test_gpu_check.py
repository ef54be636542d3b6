"""The GPU check on the CPU with tiny shapes: every part runs and lands in JSON and markdown,
so it runs the first time a GPU is lent; without CUDA it refuses in one line."""

import json

import pytest
import torch

from musketeers.bench import gpu_check
from musketeers.cache.experts import resolve_local
from musketeers.teams import expert_spec


@pytest.fixture(scope="module")
def model_dir():
    return resolve_local(expert_spec("tiny-qwen2"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_without_cuda_it_names_the_cpu_option_and_writes_nothing(tmp_path, model_dir, capsys):
    assert gpu_check.main([str(tmp_path / "out"), "--model-dir", model_dir]) == 2
    err = capsys.readouterr().err
    assert "no CUDA device" in err and "--device cpu" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_a_folder_without_a_config_is_refused(tmp_path, capsys):
    assert gpu_check.main([str(tmp_path / "out"), "--device", "cpu",
                           "--model-dir", str(tmp_path)]) == 2
    assert "--model-dir" in capsys.readouterr().err


@pytest.mark.slow  # a whole smoke step and three small policies: over 30 s on a 2-core CPU
def test_the_cpu_run_measures_every_part(tmp_path, model_dir):
    out = tmp_path / "out"
    assert gpu_check.main([str(out), "--device", "cpu", "--model-dir", model_dir,
                           "--reps", "1", "--warmup", "0"]) == 0
    r = json.loads((out / "gpu_check.json").read_text())
    step = r["step"]
    assert step["budget"] == "smoke" and len(step["step_s_each"]) == 1
    assert set(step["phases"]) >= {"sample", "reference", "forward", "backward"}
    assert step["roofline_s"] > 0 and step["peak_gpu_mib"] == 0  # no GPU, none claimed
    agree = r["logprobs"]
    assert agree["tokens"] > 100
    # the CPU against itself in float32 is the same computation; bf16 is near, not equal
    assert agree["float32"]["max_abs"] == 0.0
    assert 0.0 < agree["bfloat16"]["mean_abs"] < 0.5
    md = (out / "gpu_check.md").read_text()
    assert "smoke step" in md and "| forward |" in md and "bfloat16 max" in md
    assert "FAILED" not in md


def test_the_paper_step_keeps_the_budgets_decode_settings(tmp_path, monkeypatch):
    """On CUDA the check measures the step the budget runs: its own ``decode_prompts`` (32
    prompts sampled as one batch) and graphs, never an override back to one micro-batch."""
    from musketeers.bench import gpu_step, train_bench

    seen: list[dict] = []
    monkeypatch.setattr(train_bench, "run_steps",
                        lambda params: seen.append(params["overrides"]) or {})
    gpu_step.measure(tmp_path, tmp_path, "arithmetic", "paper", "as-is", 1, 0, device="cpu")
    assert "decode_prompts" not in seen[0] and "decode_graphs" not in seen[0]
    gpu_step.measure(tmp_path, tmp_path, "arithmetic", "paper", "as-is", 1, 0, device="cpu",
                     decode_prompts=0, decode_graphs=False)
    assert seen[1]["decode_prompts"] == 0 and seen[1]["decode_graphs"] is False
