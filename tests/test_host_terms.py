"""Advice in the host's own terms: on Arm and POWER hosts (recorded cpuinfo through --sysroot), no decision
reason, note, environment variable or doctor finding names an x86 feature (AMX, AVX-512, ...) or an x86-only
variable (KMP_*, I_MPI_*), and the levers that do not apply say what the host has and why."""

from __future__ import annotations

import json
import re

import pytest
from cli_util import run_json
from hosts import CPUINFO, make_host, write

X86_TERMS = re.compile(r"\bAMX\b|amx_|\bAVX|avx|x86|\bKMP_|\bI_MPI_|Xeon|SDE\b", re.I)
X86_ENV = re.compile(r"^(KMP_|I_MPI_|CCL_|LD_PRELOAD$)")

_ARM_V1 = (CPUINFO / "linux-amazon-neoverse_v1").read_text().split("\n\n")[0]
_ARM_N1_FEATURES = "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs"


def _arm_block(cpu: int, features: str | None, part: str) -> str:
    lines = []
    for line in _ARM_V1.splitlines():
        if line.startswith("processor"):
            line = f"processor\t: {cpu}"
        elif line.startswith("Features") and features is not None:
            line = f"Features\t: {features}"
        elif line.startswith("CPU part"):
            line = f"CPU part\t: {part}"
        lines.append(line)
    return "\n".join(lines) + "\n\n"


def _host(tmp_path, kind: str):
    root = make_host(tmp_path, sockets=2, cores_per_socket=8)  # the /sys tree; cpuinfo replaced below
    if kind == "arm-bf16":
        text = "".join(_arm_block(c, None, "0xd40") for c in range(16))
    elif kind == "arm-nobf16":
        text = "".join(_arm_block(c, _ARM_N1_FEATURES, "0xd0c") for c in range(16))
    else:
        gen = {"power9": "POWER9 (architected), altivec supported", "power10": "POWER10 (architected), altivec supported"}[kind]
        text = "".join(f"processor\t: {c}\ncpu\t\t: {gen}\nclock\t\t: 3000.000000MHz\nrevision\t: 2.0 (pvr 0080 0200)\n\n"
                       for c in range(16))
    write(root, "/proc/cpuinfo", text)
    return root


HOSTS = ("arm-bf16", "arm-nobf16", "power9", "power10")
STACK = {"torch": "2.8.0+cpu", "intel_extension_for_pytorch": "2.8.0", "oneccl_bind_pt": "2.8.0+cpu",
         "transformers": "5.23.0", "accelerate": "1.15.0"}
SCENARIOS = {
    "default": ([], None),
    "two-ranks": (["--nproc-per-node", "2"], None),
    "intel-addons-installed": (["--nproc-per-node", "2"], STACK),
    "bf16-asked": (["--set", "dtype=bf16", "--nproc-per-node", "2"], {"torch": "2.13.0+cpu"}),
    "compile-asked": (["--set", "compile=true"], {"torch": "2.13.0+cpu", "transformers": "5.23.0"}),
}


def _texts(obj):
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield str(key)
            yield from _texts(value)
    elif isinstance(obj, list):
        for value in obj:
            yield from _texts(value)
    elif isinstance(obj, str):
        yield obj


@pytest.mark.parametrize("kind", HOSTS)
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_decision_speaks_the_hosts_terms(tmp_path, kind, scenario):
    args, packages = SCENARIOS[scenario]
    env = {"CPUPERF_OVERRIDE_PACKAGES": json.dumps(packages)} if packages else None
    rep, _ = run_json(["recommend", "--sysroot", str(_host(tmp_path, kind)), *args], env)
    arch = "aarch64" if kind.startswith("arm") else "ppc64le"
    for d in rep["decisions"]:
        bad = [t for t in [d["reason"], *_texts(d["evidence"])] if X86_TERMS.search(t)]
        assert not bad, (kind, scenario, d["id"], bad)
    for note in rep["notes"]:
        assert not X86_TERMS.search(note), (kind, scenario, note)
    assert not [k for k in rep["env"] if X86_ENV.match(k)], (kind, scenario, rep["env"])
    by_id = {d["id"]: d for d in rep["decisions"]}
    for lever in ("dtype", "fp32_math_mode", "ipex"):  # what the host has, and why the lever (does not) apply
        assert arch in by_id[lever]["reason"], (lever, by_id[lever]["reason"])
    assert by_id["ipex"]["value"] is False
    if by_id["nproc_per_node"]["value"] > 1:
        assert by_id["ddp_backend"]["value"] == "gloo" and arch in by_id["ddp_backend"]["reason"]


@pytest.mark.parametrize("kind,has", [("arm-bf16", "Arm BF16"), ("arm-nobf16", "no Arm BF16"),
                                      ("power9", "no MMA"), ("power10", "POWER10 MMA")])
def test_the_math_mode_reason_names_what_the_host_has(tmp_path, kind, has):
    rep, _ = run_json(["recommend", "--sysroot", str(_host(tmp_path, kind))])
    d = next(x for x in rep["decisions"] if x["id"] == "fp32_math_mode")
    assert d["value"] is None and has in d["reason"]


@pytest.mark.parametrize("kind", HOSTS)
@pytest.mark.parametrize("packages", [None, {"torch": "2.13.0+cpu", "transformers": "5.24.0", "accelerate": "1.15.0"}])
def test_every_doctor_finding_speaks_the_hosts_terms(tmp_path, kind, packages):
    env = {"CPUPERF_OVERRIDE_PACKAGES": json.dumps(packages)} if packages else None
    rep, _ = run_json(["doctor", "--sysroot", str(_host(tmp_path, kind))], env, expect_rc=None)
    assert rep["host"]["cpu"]["arch"] == ("aarch64" if kind.startswith("arm") else "ppc64le")
    for f in rep["findings"]:
        for text in (f["message"], f["fix"] or ""):
            assert not X86_TERMS.search(text), (kind, f["id"], text)


@pytest.mark.parametrize("kind", ["arm-bf16", "power10"])
@pytest.mark.parametrize("setting,word", [("ipex=true", "ipex"), ("ddp_backend=ccl", "oneCCL")])
def test_an_intel_only_lever_asked_for_is_refused_in_the_hosts_terms(tmp_path, kind, setting, word):
    pk = json.dumps(STACK)
    rep, _ = run_json(["recommend", "--sysroot", str(_host(tmp_path, kind)), "--nproc-per-node", "2",
                       "--set", setting], {"CPUPERF_OVERRIDE_PACKAGES": pk}, expect_rc=2)
    message = rep["error"]["message"] + " " + (rep["error"].get("hint") or "")
    assert word.lower() in message.lower() and ("aarch64" in message or "ppc64le" in message)
    assert not X86_TERMS.search(message)
