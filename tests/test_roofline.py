"""The roofline's arithmetic, checked against numbers worked out by hand from the models'
real config.json values and the GPUs' datasheets, not against the code's own output."""

from __future__ import annotations

import argparse
import json
import math
from typing import TYPE_CHECKING

import pytest

from cli.roofline import add_roofline_parser, parse_int_list, run_roofline
from engine.errors import BadOption
from engine.sizes import GIB
from roofline import cpu_calibration, hardware
from roofline.cpu_calibration import calibrate_cpu, calibration_cache_path
from roofline.floors import (
    RooflineReport,
    concurrent_requests,
    emulated_pool_tokens,
    itl_floor_s,
    kv_pool_bytes,
    kv_pool_tokens,
    max_single_prompt_tokens,
    percent_of_floor,
    predict,
    prefill_flops,
    ttft_bound,
    ttft_floor_s,
)
from roofline.geometry import ModelGeometry
from roofline.hardware import (
    known_gpus,
    known_models,
    load_geometry,
    load_profile,
)
from roofline.hardware_profile import HardwareProfile

if TYPE_CHECKING:
    from pathlib import Path

L4_BYTES = 23_034 * 1024**2  # nvidia-smi's memory.total for an L4


@pytest.fixture
def qwen() -> ModelGeometry:
    return load_geometry("qwen2.5-7b-instruct")


@pytest.fixture
def llama() -> ModelGeometry:
    return load_geometry("llama-3.1-8b")


@pytest.fixture
def smol() -> ModelGeometry:
    return load_geometry("smollm2-135m-instruct")


@pytest.fixture
def l4() -> HardwareProfile:
    return load_profile("l4")


# --------------------------------------------------------------------------- geometry


def test_kv_bytes_per_token_by_hand(
    qwen: ModelGeometry, smol: ModelGeometry, llama: ModelGeometry
) -> None:
    # 2 (K and V) x layers x KV heads x head_dim x 2 bytes (bf16)
    assert qwen.kv_bytes_per_token == 2 * 28 * 4 * 128 * 2 == 57_344
    assert smol.kv_bytes_per_token == 2 * 30 * 3 * 64 * 2 == 23_040
    assert llama.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131_072


def test_geometry_fields_come_from_the_config(qwen: ModelGeometry, smol: ModelGeometry) -> None:
    assert (qwen.num_layers, qwen.num_attention_heads, qwen.num_kv_heads) == (28, 28, 4)
    assert qwen.head_dim == 3584 // 28 == 128
    assert qwen.max_position_embeddings == 32_768
    assert not qwen.tie_word_embeddings
    assert smol.tie_word_embeddings
    assert smol.head_dim == 64
    assert smol.dtype_bytes == 2


def test_qwen_param_count_by_hand(qwen: ModelGeometry) -> None:
    h, i, vocab, layers, n_q, n_kv, d = 3584, 18944, 152_064, 28, 28, 4, 128
    q = h * n_q * d + n_q * d  # weight + bias (Qwen2 biases q, k, v)
    kv = 2 * (h * n_kv * d + n_kv * d)
    o = n_q * d * h  # no bias on o
    mlp = 3 * h * i
    norms = 2 * h
    per_layer = q + kv + o + mlp + norms
    expected = vocab * h + layers * per_layer + h + vocab * h  # untied lm_head
    assert expected == 7_615_616_512
    assert qwen.num_params == expected
    assert abs(qwen.num_params - 7.62e9) / 7.62e9 < 0.02


def test_llama_param_count_by_hand(llama: ModelGeometry) -> None:
    h, i, vocab, layers, n_q, n_kv, d = 4096, 14336, 128_256, 32, 32, 8, 128
    per_layer = h * n_q * d + 2 * h * n_kv * d + n_q * d * h + 3 * h * i + 2 * h
    expected = 2 * vocab * h + layers * per_layer + h
    assert expected == 8_030_261_248
    assert llama.num_params == expected
    assert abs(llama.num_params - 8.03e9) / 8.03e9 < 0.02


def test_smollm2_param_count_by_hand(smol: ModelGeometry) -> None:
    h, i, vocab, layers, n_q, n_kv, d = 576, 1536, 49_152, 30, 9, 3, 64
    per_layer = h * n_q * d + 2 * h * n_kv * d + n_q * d * h + 3 * h * i + 2 * h
    expected = vocab * h + layers * per_layer + h  # tied: no separate lm_head
    assert expected == 134_515_008
    assert smol.num_params == expected
    assert abs(smol.num_params - 1.35e8) / 1.35e8 < 0.02


def test_attention_bias_and_mlp_bias_add_params() -> None:
    base = {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 100,
        "max_position_embeddings": 256,
        "tie_word_embeddings": True,
    }
    plain = ModelGeometry.from_hf_config(base, "t").num_params
    biased = ModelGeometry.from_hf_config({**base, "attention_bias": True}, "t").num_params
    # q (64) + k (2*16) + v (2*16) + o (64) biases per layer, 2 layers
    assert biased - plain == 2 * (64 + 32 + 32 + 64)
    mlp_biased = ModelGeometry.from_hf_config({**base, "mlp_bias": True}, "t").num_params
    assert mlp_biased - plain == 2 * (2 * 128 + 64)


def test_load_geometry_aliases_and_case(qwen: ModelGeometry) -> None:
    assert load_geometry("Qwen/Qwen2.5-7B-Instruct") == qwen
    assert load_geometry("  QWEN2.5-7B-INSTRUCT ") == qwen
    assert load_geometry("meta-llama/Llama-3.1-8B").num_layers == 32


def test_load_geometry_unknown_lists_known_names() -> None:
    with pytest.raises(BadOption) as info:
        load_geometry("gpt-5-nano")
    message = info.value.plain()
    assert "gpt-5-nano" in message
    for name in known_models():
        assert name in message


def test_load_geometry_from_local_folder_and_file(tmp_path: Path) -> None:
    cfg = {
        "model_type": "llama",
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "vocab_size": 49_152,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
        "dtype": "bfloat16",
    }
    folder = tmp_path / "MySmol"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    from_folder = load_geometry(folder)
    assert from_folder.name == "MySmol"
    assert from_folder.kv_bytes_per_token == 23_040
    assert from_folder.num_params == 134_515_008
    assert load_geometry(str(folder / "config.json")).num_params == 134_515_008


def test_load_geometry_rejects_bad_local_configs(tmp_path: Path) -> None:
    with pytest.raises(BadOption, match=r"no config\.json"):
        load_geometry(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(BadOption, match="cannot read"):
        load_geometry(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64}))
    with pytest.raises(BadOption, match="needs a positive integer"):
        load_geometry(tmp_path)
    moe = {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "vocab_size": 100,
        "max_position_embeddings": 256,
        "num_local_experts": 8,
    }
    (tmp_path / "config.json").write_text(json.dumps(moe))
    with pytest.raises(BadOption, match="mixture-of-experts"):
        load_geometry(tmp_path)


# --------------------------------------------------------------------------- hardware


def test_load_profile_l4_numbers(l4: HardwareProfile) -> None:
    assert l4.peak_bf16_flops == 121e12
    assert l4.mem_bandwidth_bytes_s == 300e9
    assert l4.memory_bytes == L4_BYTES


def test_load_profile_case_and_alias() -> None:
    assert load_profile("L4") == load_profile("l4")
    assert load_profile("H100").key == "h100-sxm"
    assert load_profile("h200").memory_bytes > load_profile("h100-sxm").memory_bytes


def test_every_shipped_gpu_is_dense_and_sane() -> None:
    for key in known_gpus():
        if key == "cpu":
            continue
        hw = load_profile(key)
        # Dense bf16 figures sit between 100 and 1,000 TFLOP/s for these cards; a
        # sparsity figure (twice that) for the H100/H200 would break the upper bound.
        assert 100e12 <= hw.peak_bf16_flops <= 1000e12, key
        assert 200e9 <= hw.mem_bandwidth_bytes_s <= 5000e9, key
        assert 20 * GIB <= hw.memory_bytes <= 150 * GIB, key


def test_load_profile_unknown_lists_keys() -> None:
    with pytest.raises(BadOption) as info:
        load_profile("tpu-v5")
    message = info.value.plain()
    assert "tpu-v5" in message
    assert "l4" in message
    assert "h100-sxm" in message
    assert "cpu" in message


# --------------------------------------------------------------------------- floors


def test_itl_floor_qwen_on_l4_is_weights_over_bandwidth(
    qwen: ModelGeometry, l4: HardwareProfile
) -> None:
    weight_bytes = 7_615_616_512 * 2
    expected = weight_bytes / 300e9  # ~50.8 ms
    assert itl_floor_s(qwen, l4, 0) == pytest.approx(expected, abs=1e-3)
    assert 0.050 < itl_floor_s(qwen, l4, 0) < 0.052
    # KV read grows the floor: 4,096 tokens x 57,344 bytes more per step.
    assert itl_floor_s(qwen, l4, 4096) == pytest.approx(
        (weight_bytes + 4096 * 57_344) / 300e9, rel=1e-9
    )
    # A batch shares the weights but not the KV.
    assert itl_floor_s(qwen, l4, 4096, batch=4) == pytest.approx(
        (weight_bytes + 4 * 4096 * 57_344) / 300e9, rel=1e-9
    )


def test_prefill_flops_by_hand(qwen: ModelGeometry) -> None:
    non_embedding = 7_615_616_512 - 2 * 152_064 * 3584
    n = 4096
    matmuls = 2 * non_embedding * n
    attention = 2 * 2 * 28 * 28 * 128 * (n * (n + 1) // 2)  # causal: n(n+1)/2 pairs
    logits = 2 * 152_064 * 3584  # last position only
    assert prefill_flops(qwen, n) == matmuls + attention + logits


def test_ttft_floor_qwen_on_l4_at_4096(qwen: ModelGeometry, l4: HardwareProfile) -> None:
    ttft = ttft_floor_s(qwen, l4, 4096)
    assert ttft == pytest.approx(prefill_flops(qwen, 4096) / 121e12, rel=1e-12)
    # ~0.47 s: the notes' rougher 2 x 7.6e9 x 4096 / 121e12 = 0.51 s also counts the
    # embedding tables as matmuls for every token and ignores attention.
    assert 0.45 < ttft < 0.6
    assert ttft == pytest.approx(2 * 7.6e9 * 4096 / 121e12, rel=0.1)
    assert ttft_bound(qwen, l4, 4096) == "compute"


def test_ttft_floor_is_memory_bound_for_tiny_prompts(
    qwen: ModelGeometry, l4: HardwareProfile
) -> None:
    # One token cannot be faster than one pass over 15.2 GB of weights.
    assert ttft_floor_s(qwen, l4, 1) == pytest.approx((qwen.weight_bytes + 57_344) / 300e9)
    assert ttft_bound(qwen, l4, 1) == "memory"


def test_ttft_grows_faster_than_itl(qwen: ModelGeometry, l4: HardwareProfile) -> None:
    # The article's finding, on paper: prefill is compute-bound, decode memory-bound.
    ttft_ratio = ttft_floor_s(qwen, l4, 4096) / ttft_floor_s(qwen, l4, 512)
    itl_ratio = itl_floor_s(qwen, l4, 4096) / itl_floor_s(qwen, l4, 512)
    assert ttft_ratio > 8
    assert itl_ratio < 1.1


def test_percent_of_floor() -> None:
    assert percent_of_floor(0.100, 0.051) == pytest.approx(51.0)
    assert percent_of_floor(0.051, 0.051) == pytest.approx(100.0)
    with pytest.raises(ValueError, match="positive"):
        percent_of_floor(0.0, 0.05)


# --------------------------------------------------------------------------- KV pool


def test_kv_pool_qwen_on_l4_matches_vllm_observation(
    qwen: ModelGeometry, l4: HardwareProfile
) -> None:
    pool = kv_pool_bytes(qwen, l4, 0.9)
    tokens = kv_pool_tokens(qwen, l4, 0.9)
    assert 4.0 * GIB <= pool <= 4.5 * GIB
    assert 75_000 <= tokens <= 85_000
    assert tokens % 16 == 0  # whole 16-token blocks
    assert tokens <= pool // 57_344 < tokens + 16


def test_kv_pool_with_explicit_reserve(qwen: ModelGeometry, l4: HardwareProfile) -> None:
    reserve = 1 * GIB
    expected = int(L4_BYTES * 0.9) - 7_615_616_512 * 2 - reserve
    assert kv_pool_bytes(qwen, l4, 0.9, activation_reserve_bytes=reserve) == expected
    assert kv_pool_bytes(qwen, l4, 0.8) < kv_pool_bytes(qwen, l4, 0.9)


def test_weights_that_do_not_fit_leave_no_pool(llama: ModelGeometry, l4: HardwareProfile) -> None:
    # 16 GB of weights in half of an L4's 24 GB: vLLM would not start.
    assert kv_pool_bytes(llama, l4, 0.5) == 0
    assert kv_pool_tokens(llama, l4, 0.5) == 0
    assert concurrent_requests(llama, l4, 1024, 0.5) == 0
    report = predict(llama, l4, [1024], util=0.5)
    assert not report.weights_fit
    assert not report.predictions[0].fits


def test_longest_request_and_concurrency(
    qwen: ModelGeometry, smol: ModelGeometry, l4: HardwareProfile
) -> None:
    pool = kv_pool_tokens(qwen, l4, 0.9)
    assert max_single_prompt_tokens(qwen, l4, 0.9) == 32_768  # the model's context limit
    assert max_single_prompt_tokens(smol, l4, 0.9) == 8192
    # 4,096 + 128 = 4,224 tokens = 264 whole blocks per request
    assert concurrent_requests(qwen, l4, 4224, 0.9) == pool // 4224
    # 4,100 tokens still occupy 257 blocks = 4,112 tokens
    assert concurrent_requests(qwen, l4, 4100, 0.9) == pool // 4112
    assert concurrent_requests(qwen, l4, 40_000, 0.9) == 0  # over max_position_embeddings


def test_emulated_pool_tokens(qwen: ModelGeometry, l4: HardwareProfile) -> None:
    assert emulated_pool_tokens(qwen, l4) == kv_pool_tokens(qwen, l4, 0.9)
    assert emulated_pool_tokens(qwen, l4, 0.5) < emulated_pool_tokens(qwen, l4, 0.9)


def test_util_out_of_range_is_rejected(qwen: ModelGeometry, l4: HardwareProfile) -> None:
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(BadOption, match="gpu-memory-utilization"):
            kv_pool_bytes(qwen, l4, bad)


# --------------------------------------------------------------------------- predict


def test_predict_report_and_json_round_trip(qwen: ModelGeometry, l4: HardwareProfile) -> None:
    report = predict(qwen, l4, [512, 1024, 2048, 4096], output_len=128, util=0.9)
    assert [p.prompt_len for p in report.predictions] == [512, 1024, 2048, 4096]
    assert report.kv_bytes_per_token == 57_344
    assert report.kv_pool_tokens == kv_pool_tokens(qwen, l4, 0.9)
    assert report.starts_at_default_max_model_len  # ~80k tokens >= 32,768
    last = report.predictions[-1]
    assert last.kv_bytes == 4096 * 57_344
    assert last.request_kv_bytes == (4096 + 128) * 57_344
    assert last.fits
    assert last.concurrent == report.kv_pool_tokens // 4224
    # ITL is quoted at the middle of the output: context 4096 + 64
    assert last.itl_floor_s == pytest.approx(itl_floor_s(qwen, l4, 4160))

    text = json.dumps(report.to_dict())
    data = json.loads(text)
    assert data == report.to_dict()
    assert RooflineReport.from_dict(data) == report
    assert data["predictions"][0]["prompt_len"] == 512


def test_predict_rejects_bad_lengths(qwen: ModelGeometry, l4: HardwareProfile) -> None:
    with pytest.raises(BadOption):
        predict(qwen, l4, [])
    with pytest.raises(BadOption):
        predict(qwen, l4, [512, 0])
    with pytest.raises(BadOption):
        predict(qwen, l4, [512], output_len=0)


def test_prompt_longer_than_context_does_not_fit(smol: ModelGeometry, l4: HardwareProfile) -> None:
    report = predict(smol, l4, [8000, 8192], output_len=128)
    assert report.predictions[0].fits  # 8,128 <= 8,192
    assert not report.predictions[1].fits
    assert report.predictions[1].concurrent == 0


# --------------------------------------------------------------------------- CLI


def test_parse_int_list() -> None:
    assert parse_int_list("512,1024, 2048 ,4096", "--prompt-lens") == [512, 1024, 2048, 4096]
    assert parse_int_list("7", "--x") == [7]


@pytest.mark.parametrize("text", ["", " , ", "abc", "512,,1024", "512,-5", "0", "1.5"])
def test_parse_int_list_errors(text: str) -> None:
    with pytest.raises(BadOption) as info:
        parse_int_list(text, "--prompt-lens")
    assert info.value.option == "--prompt-lens"
    assert "--prompt-lens" in info.value.plain()


def _args(**overrides: object) -> argparse.Namespace:
    values: dict[str, object] = {
        "gpu": "l4",
        "model": "qwen2.5-7b-instruct",
        "prompt_lens": "512,1024,2048,4096",
        "output_len": 128,
        "gpu_memory_utilization": 0.9,
        "json": False,
        "recalibrate": False,
    }
    values.update(overrides)
    return argparse.Namespace(**values)


def test_cli_table_shows_the_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_roofline(_args()) == 0
    out = capsys.readouterr().out
    qwen = load_geometry("qwen2.5-7b-instruct")
    l4 = load_profile("l4")
    assert "57,344" in out
    assert f"{kv_pool_tokens(qwen, l4, 0.9):,}" in out
    assert f"{ttft_floor_s(qwen, l4, 4096) * 1e3:,.1f}" in out  # 469.6 ms
    assert f"{itl_floor_s(qwen, l4, 512 + 64) * 1e3:,.2f}" in out  # ~50.9 ms
    assert "4,096" in out
    assert "NVIDIA L4" in out


def test_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_roofline(_args(json=True, prompt_lens="1000")) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["kv_bytes_per_token"] == 57_344
    assert data["predictions"][0]["prompt_len"] == 1000
    assert data["hardware"]["key"] == "l4"


@pytest.mark.parametrize(
    ("overrides", "option"),
    [
        ({"gpu": "tpu"}, "--gpu"),
        ({"model": "nope-7b"}, "--model"),
        ({"prompt_lens": ""}, "--prompt-lens"),
        ({"prompt_lens": "512,-1"}, "--prompt-lens"),
        ({"output_len": "many"}, "--output-len"),
        ({"gpu_memory_utilization": "2"}, "--gpu-memory-utilization"),
    ],
)
def test_cli_bad_input_is_one_plain_line(
    capsys: pytest.CaptureFixture[str], overrides: dict[str, object], option: str
) -> None:
    assert run_roofline(_args(**overrides)) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("kvscope: ")
    assert option in lines[0]
    assert "Traceback" not in captured.err


def test_add_roofline_parser_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="kvscope")
    add_roofline_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["roofline", "--model", "smollm2-135m-instruct", "--json"])
    assert args.handler is run_roofline
    assert args.gpu == "l4"
    assert run_roofline(args) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["kv_bytes_per_token"] == 23_040
    assert [p["prompt_len"] for p in data["predictions"]] == [512, 1024, 2048, 4096]


# --------------------------------------------------------------------------- calibration


def test_calibrate_cpu_writes_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVSCOPE_CACHE_DIR", str(tmp_path))
    assert calibration_cache_path() == tmp_path / "calibration.json"
    profile = calibrate_cpu(seconds_budget=0.05)
    assert profile.key == "cpu"
    # Loose physical bounds: any machine that runs the tests copies faster than 100 MB/s
    # and multiplies faster than 100 MFLOP/s, and no CPU reaches 100 TB/s or 1 PFLOP/s.
    assert 1e8 < profile.mem_bandwidth_bytes_s < 1e14
    assert 1e8 < profile.peak_bf16_flops < 1e15
    assert profile.memory_bytes > 0
    cached = json.loads((tmp_path / "calibration.json").read_text())
    assert HardwareProfile.from_dict(cached["profile"]) == profile

    # load_profile("cpu") now uses the cache instead of measuring again ...
    def fail(*_: object, **__: object) -> HardwareProfile:
        raise AssertionError("should have used the cache")

    monkeypatch.setattr(hardware, "calibrate_cpu", fail)
    assert load_profile("CPU") == profile
    # ... unless told to recalibrate.
    with pytest.raises(AssertionError, match="cache"):
        load_profile("cpu", recalibrate=True)


def test_cache_from_another_machine_is_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVSCOPE_CACHE_DIR", str(tmp_path))
    profile = HardwareProfile("CPU", "cpu", 1e11, 2e10, 8 * GIB)
    payload = {
        "schema": cpu_calibration.CALIBRATION_SCHEMA,
        "fingerprint": {"machine": "elsewhere"},
        "profile": profile.to_dict(),
    }
    (tmp_path / "calibration.json").write_text(json.dumps(payload))
    fresh = HardwareProfile("fresh", "cpu", 2e11, 3e10, 8 * GIB)
    monkeypatch.setattr(hardware, "calibrate_cpu", lambda *a, **k: fresh)
    assert load_profile("cpu") == fresh


def test_cli_on_cpu_uses_calibration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KVSCOPE_CACHE_DIR", str(tmp_path))
    fake = HardwareProfile("Test CPU", "cpu", 400e9, 25e9, 24 * GIB)
    monkeypatch.setattr(hardware, "calibrate_cpu", lambda *a, **k: fake)
    args = _args(gpu="cpu", model="smollm2-135m-instruct", json=True, prompt_lens="512")
    assert run_roofline(args) == 0
    data = json.loads(capsys.readouterr().out)
    smol = load_geometry("smollm2-135m-instruct")
    # decode floor: 269 MB of weights (+ KV at context 576) over 25 GB/s, ~11 ms
    expected_itl = (134_515_008 * 2 + (512 + 64) * 23_040) / 25e9
    assert data["predictions"][0]["itl_floor_s"] == pytest.approx(expected_itl)
    assert math.isclose(data["predictions"][0]["ttft_floor_s"], prefill_flops(smol, 512) / 400e9)
