"""benchmarks/codec_cpu.py runs in its smoke mode and writes both columns (no figure asserted)."""

import json

from benchmarks import codec_cpu


def test_codec_cpu_benchmark_runs_and_writes_both_columns(tmp_path):
    codec_cpu.main(["--smoke", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "codec_cpu.json").read_text())
    assert set(data["cpu_us"]) == set(codec_cpu.MESSAGES)
    assert all(set(ops) == set(codec_cpu.OPS) for ops in data["cpu_us"].values())
    assert data["sizes"]["small"]["record_bytes"] < data["sizes"]["small"]["json_bytes"]
    assert "JSON write µs" in (tmp_path / "codec_cpu.md").read_text()
