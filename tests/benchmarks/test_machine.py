"""benchmarks/machine.py: the CPU generation and SIMD flags recorded with every benchmark JSON."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_machine", REPO / "benchmarks" / "machine.py")
machine = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(machine)

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC
stepping\t: 1
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw avx512_bf16 avx512_vnni sse4_2

processor\t: 1
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
flags\t\t: amx_tile amx_bf16
"""


def test_parse_cpuinfo_reads_the_first_block():
    got = machine.parse_cpuinfo(CPUINFO)
    assert got == {"cpu_vendor": "AuthenticAMD", "cpu_family": 25, "cpu_model": 17, "cpu_model_name": "AMD EPYC",
                   "cpu_stepping": 1, "simd": ["avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16"]}


def test_describe_without_cpuinfo_keeps_the_rest(tmp_path):
    got = machine.describe(tmp_path / "missing")
    assert got["cpus"] >= 1 and "platform" in got and "cpu_family" not in got


def test_describe_reads_a_given_file(tmp_path):
    f = tmp_path / "cpuinfo"
    f.write_text(CPUINFO)
    got = machine.describe(f)
    assert got["cpu_family"] == 25 and got["simd"][-1] == "avx512_bf16" and len(got["loadavg"]) == 3


def test_describe_records_the_xla_flags_in_effect(tmp_path, monkeypatch):
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    assert machine.describe(tmp_path / "missing")["xla_flags"] is None
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_concurrency_optimized_scheduler=false")
    assert machine.describe(tmp_path / "missing")["xla_flags"] == "--xla_cpu_enable_concurrency_optimized_scheduler=false"


def test_describe_records_the_glibc_tunables_in_effect(tmp_path, monkeypatch):
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    assert machine.describe(tmp_path / "missing")["glibc_tunables"] is None
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")
    assert machine.describe(tmp_path / "missing")["glibc_tunables"] == "glibc.malloc.hugetlb=1"
