"""One artifact for several CPUs (`--arch x86-64-v4,x86-64-v3`, `--arch portable`).

`--cpu-dispatch modules` (the default): one .vmfb per CPU, each the single-CPU build, sharing the
.irpa; llmc.load runs the best one the CPU can. `--cpu-dispatch variants`: each executable carries a
variant per CPU, best first, every one but the last guarded by the CPU features it was compiled for
(compiler/cpu_variants.py); the runtime fills IREE's CPU data with the artifact's probe before
loading, so the guards read the real CPU.
"""

import json
import subprocess
import sys
import textwrap

import pytest
import torch

import llmc
from llmc.compiler import cpu_variants, targets, vmfb
from llmc.errors import RuntimeLoadError, UnsupportedTargetError
from llmc.runtime import module as rt_module

HAVE = rt_module.host_cpu_flags() or set()
AVX512 = "avx512f" in HAVE


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 32)).eval()


def test_arch_lists_and_presets_resolve_to_cpus_best_first():
    assert targets.resolve("cpu", "portable", "f32").cpus == ("x86-64-v4", "x86-64-v3")
    t = targets.resolve("cpu", "cascadelake,x86-64-v3", "f32", cpu_dispatch="variants")
    assert t.cpus == ("cascadelake", "x86-64-v3")
    # No target flags: the module carries one local device with both executable targets, in order.
    assert not any(f.startswith(("--iree-llvmcpu-target-cpu", "--iree-hal-target-device")) for f in t.iree_flags)
    assert "--iree-global-opt-data-tiling=true" in t.iree_flags
    mt = t.module_target
    assert mt.count('#hal.executable.target<"llvm-cpu"') == 2
    assert mt.index('cpu = "cascadelake"') < mt.index('cpu = "x86-64-v3"')
    assert targets.resolve("cpu", "x86-64-v3", "f32").module_target is None  # one CPU: the flags name it
    # One module per CPU (the default): each is compiled exactly as the single-CPU build.
    m = targets.resolve("cpu", "cascadelake,x86-64-v3", "f32")
    assert m.cpu_modules and m.module_target is None
    assert m.iree_flags == targets.resolve("cpu", "x86-64-v3", "f32").iree_flags
    assert m.for_cpu("cascadelake").iree_flags == targets.resolve("cpu", "cascadelake", "f32").iree_flags
    assert "--iree-opt-data-tiling=true" in m.iree_flags
    with pytest.raises(UnsupportedTargetError, match="--cpu-dispatch='fastest'"):
        targets.resolve("cpu", "portable", "f32", cpu_dispatch="fastest")


@pytest.mark.parametrize("arch, words", [
    ("x86-64-v4,skylake-avx513", "'skylake-avx513' is not a CPU"),
    ("x86-64-v3,x86-64-v3", "names a CPU twice"),
    ("host,x86-64-v3", "'host' is not a CPU"),
])
def test_bad_arch_lists_are_refused(arch, words):
    with pytest.raises(UnsupportedTargetError, match=words):
        targets.resolve("cpu", arch, "f32")


def test_conditions_guard_every_variant_but_the_fallback():
    conds = targets.cpu_variant_conditions(("x86-64-v4", "x86-64-v3"))
    assert [c for c, _ in conds] == ["x86-64-v4", "x86-64-v3"]
    v4 = set(conds[0][1])
    assert {"avx512f", "avx512bw", "avx512vl", "avx2", "fma"} <= v4 and v4 <= targets.IREE_X86_QUERY_KEYS
    assert conds[1][1] == ()
    assert rt_module.chosen_variant(conds, lambda f: f != "avx512bw") == "x86-64-v3"
    assert rt_module.chosen_variant(conds, lambda f: True) == "x86-64-v4"


def test_condition_text_is_inserted_into_each_guarded_variant():
    head = '    hal.executable.variant public @{n} target(<"llvm-cpu", "embedded-elf-x86_64", {{cpu = "{cpu}", x = 1}}>) {{\n'
    text = "".join(head.format(n=n, cpu=cpu) + "      body\n    }\n" for n, cpu in (("a", "x86-64-v4"), ("b", "x86-64-v3")))
    out = cpu_variants.condition_variants(text, [("x86-64-v4", ("avx2", "avx512f")), ("x86-64-v3", ())])
    lines = out.splitlines()
    i = lines.index(head.format(n="a", cpu="x86-64-v4").rstrip("\n"))
    assert lines[i + 1].strip() == "hal.executable.condition(%device: !hal.device) -> i1 {"
    assert 'key("hal.cpu" :: "avx2")' in lines[i + 2] and 'key("hal.cpu" :: "avx512f")' in lines[i + 3]
    assert lines[i + 4].strip() == "%all1 = arith.andi %v0, %v1 : i1" and lines[i + 5].strip() == "hal.return %all1 : i1"
    assert out.count("hal.executable.condition") == 1  # the fallback is unguarded
    # The printer's alias form names the target once at the top.
    aliased = '#exe = #hal.executable.target<"llvm-cpu", "embedded-elf-x86_64", {cpu = "x86-64-v4"}>\n' + \
        "    hal.executable.variant public @a target(#exe) {\n    }\n"
    assert "hal.cpu" in cpu_variants.condition_variants(aliased, [("x86-64-v4", ("avx2",))])
    with pytest.raises(llmc.errors.CompileError, match="no executable variant for --arch CPU.s. x86-64-v3"):
        cpu_variants.condition_variants(aliased, [("x86-64-v4", ("avx2",)), ("x86-64-v3", ())])
    with pytest.raises(llmc.errors.CompileError, match="did not ask for"):
        cpu_variants.condition_variants(text, [("x86-64-v4", ("avx2",))])


@pytest.fixture(scope="module")
def portable(tmp_path_factory):
    out = tmp_path_factory.mktemp("portable") / "mlp.vmfb"
    return llmc.compile(_mlp(), (torch.randn(4, 64),), arch="portable", output=out, cpu_dispatch="variants")


def test_portable_module_holds_a_variant_per_cpu_and_runs_right(portable):
    info = vmfb.inspect(portable.vmfb)
    assert [e.format for e in info.executables] == ["embedded-elf-x86_64"] * 2 and all(e.valid for e in info.executables)
    t = json.loads(portable.manifest.read_text())["target"]
    assert [v["cpu"] for v in t["cpu_variants"]] == ["x86-64-v4", "x86-64-v3"]
    assert "avx512f" in t["cpu_variants"][0]["requires"] and t["cpu_variants"][1]["requires"] == []
    assert t["cpu"] == "x86-64-v3" and "avx2" in t["cpu_features"] and "avx512f" not in t["cpu_features"]
    assert (portable.vmfb.parent / t["cpu_probe"]).is_file()
    m = _mlp()
    x = torch.randn(4, 64)
    mod = llmc.load(portable.vmfb)
    with torch.no_grad():
        torch.testing.assert_close(mod(x), m(x), rtol=1e-5, atol=1e-5)
    assert mod.cpu_variant == ("x86-64-v4" if AVX512 else "x86-64-v3")


def test_info_lists_the_variants(portable):
    out = subprocess.run([sys.executable, "-m", "llmc.compiler.cli", "info", str(portable.vmfb)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    line = next(l for l in out.stdout.splitlines() if l.startswith("variants:"))
    assert "x86-64-v4 (if " in line and "avx512f" in line and "x86-64-v3 (otherwise)" in line
    assert line.endswith("this CPU runs " + ("x86-64-v4" if AVX512 else "x86-64-v3"))


def test_missing_probe_is_a_clear_error(portable, tmp_path):
    for f in (portable.vmfb, portable.params, portable.manifest):
        (tmp_path / f.name).write_bytes(f.read_bytes())
    with pytest.raises(RuntimeLoadError, match=r"mlp\.cpu-probe\.vmfb: the CPU probe .* is missing; keep it beside mlp\.vmfb") as e:
        llmc.load(tmp_path / portable.vmfb.name)
    assert e.value.exit_code == 2


def test_a_broken_probe_is_a_clear_error(portable, tmp_path, monkeypatch):
    for f in (portable.vmfb, portable.params, portable.manifest):
        (tmp_path / f.name).write_bytes(f.read_bytes())
    (tmp_path / ("mlp" + cpu_variants.PROBE_SUFFIX)).write_bytes(b"not an IREE module")
    monkeypatch.setattr(rt_module, "_CPU_DATA_READY", False)  # as in a fresh process
    mod = llmc.load(tmp_path / portable.vmfb.name)
    with pytest.raises(RuntimeLoadError, match=r"mlp\.cpu-probe\.vmfb: IREE could not run the CPU probe: ") as e:
        mod.function("main")
    assert e.value.exit_code == 2 and "\n" not in str(e.value)
    assert rt_module._CPU_DATA_READY is False  # a failed probe is not taken as done


def test_cli_refuses_a_bad_cpu_list_in_one_line(tmp_path):
    pt2 = tmp_path / "mlp.pt2"
    torch.export.save(torch.export.export(_mlp(), (torch.randn(4, 64),)), pt2)
    proc = subprocess.run([sys.executable, "-m", "llmc.compiler.cli", "compile", str(pt2), "--arch", "x86-64-v3,x86-64-v3",
                           "-o", str(tmp_path / "out.vmfb")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "--arch='x86-64-v3,x86-64-v3' names a CPU twice" in proc.stderr
    assert not list(tmp_path.glob("out*"))


def test_single_cpu_rebuild_removes_the_probe(portable, tmp_path):
    # The portable variants build (x86-64-v4,x86-64-v3) copied here with the probe it wrote beside it
    # (test_portable_module_holds_a_variant_per_cpu_and_runs_right checks it is there), then rebuilt for one CPU.
    probe = portable.vmfb.with_name("mlp" + cpu_variants.PROBE_SUFFIX)
    for f in (portable.vmfb, portable.params, portable.manifest, probe):
        (tmp_path / f.name).write_bytes(f.read_bytes())
    out = tmp_path / "mlp.vmfb"
    art = llmc.compile(_mlp(), (torch.randn(4, 64),), arch="x86-64-v3", output=out)
    assert not (tmp_path / probe.name).exists()
    assert "cpu_variants" not in json.loads(art.manifest.read_text())["target"]


_RUN = textwrap.dedent("""
    import sys, torch, llmc
    from llmc.runtime import module
    if sys.argv[2] == "cold":
        module.Module._warm_cpu_data = lambda self, config: None
    out = llmc.load(sys.argv[1])(torch.ones(4, 64))
    print("ran", float(out.sum()))
""")


@pytest.mark.skipif(AVX512 or "avx2" not in HAVE, reason="needs an AVX2 CPU without AVX-512 (AVX-512 code must be illegal here)")
def test_a_guard_that_holds_picks_its_variant_only_after_the_probe(tmp_path, monkeypatch):
    """The x86-64-v4 variant guarded by avx2 alone (which this CPU has): with the probe the runtime
    takes it and the AVX-512 code dies of SIGILL here, which shows the guard was read as true; without
    the probe the guard reads false (IREE's CPU data still empty) and the fallback runs."""
    real = targets.cpu_variant_conditions
    monkeypatch.setattr(targets, "cpu_variant_conditions",
                        lambda cpus: [(c, ("avx2",) if f else f) for c, f in real(cpus)])
    art = llmc.compile(_mlp(), (torch.randn(4, 64),), arch="portable", output=tmp_path / "m.vmfb", cpu_dispatch="variants")
    warm = subprocess.run([sys.executable, "-c", _RUN, str(art.vmfb), "warm"], capture_output=True, text=True)
    cold = subprocess.run([sys.executable, "-c", _RUN, str(art.vmfb), "cold"], capture_output=True, text=True)
    assert cold.returncode == 0 and "ran" in cold.stdout, cold.stderr[-2000:]
    assert warm.returncode == -4, (warm.returncode, warm.stdout, warm.stderr[-2000:])  # SIGILL


# ---- one module per CPU (--cpu-dispatch modules, the default) -------------------------------------


@pytest.fixture(scope="module")
def per_cpu(tmp_path_factory):
    out = tmp_path_factory.mktemp("per-cpu") / "mlp.vmfb"
    return llmc.compile(_mlp(), (torch.randn(4, 64),), arch="portable", output=out)


def test_portable_modules_one_per_cpu_share_the_parameters_and_run_right(per_cpu):
    t = json.loads(per_cpu.manifest.read_text())["target"]
    assert t["cpu_dispatch"] == "modules" and "cpu_probe" not in t
    assert t["cpu_modules"] == {"x86-64-v3": ".vmfb", "x86-64-v4": ".x86-64-v4.vmfb"}  # after the artifact's stem
    assert [v["cpu"] for v in t["cpu_variants"]] == ["x86-64-v4", "x86-64-v3"]
    assert not (per_cpu.vmfb.parent / ("mlp" + cpu_variants.PROBE_SUFFIX)).exists()
    for suffix in t["cpu_modules"].values():  # each module: one executable, for its CPU alone
        info = vmfb.inspect(per_cpu.vmfb.with_name("mlp" + suffix))
        assert [e.format for e in info.executables] == ["embedded-elf-x86_64"] and info.executables[0].valid
    assert sorted(p.name for p in per_cpu.vmfb.parent.glob("*.irpa")) == ["mlp.irpa"]
    m = _mlp()
    x = torch.randn(4, 64)
    mod = llmc.load(per_cpu.vmfb)
    with torch.no_grad():
        torch.testing.assert_close(mod(x), m(x), rtol=1e-5, atol=1e-5)
    want = "x86-64-v4" if AVX512 else "x86-64-v3"
    assert mod.cpu_variant == want and mod._module_file.name == "mlp" + t["cpu_modules"][want]


def test_info_lists_the_modules(per_cpu):
    out = subprocess.run([sys.executable, "-m", "llmc.compiler.cli", "info", str(per_cpu.vmfb)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    line = next(l for l in out.stdout.splitlines() if l.startswith("modules:"))
    assert "x86-64-v4: mlp.x86-64-v4.vmfb" in line and "x86-64-v3: mlp.vmfb" in line


def test_renamed_artifact_finds_its_modules_and_a_rebuild_removes_them(per_cpu, tmp_path, monkeypatch):
    for f in (per_cpu.vmfb, per_cpu.vmfb.with_name("mlp.x86-64-v4.vmfb"), per_cpu.params, per_cpu.manifest):
        (tmp_path / f.name.replace("mlp", "renamed")).write_bytes(f.read_bytes())
    monkeypatch.setattr(rt_module.Module, "cpu_variant", property(lambda self: "x86-64-v4"))
    assert llmc.load(tmp_path / "renamed.vmfb")._module_file.name == "renamed.x86-64-v4.vmfb"
    monkeypatch.undo()
    llmc.compile(_mlp(), (torch.randn(4, 64),), arch="x86-64-v3", output=tmp_path / "renamed.vmfb")
    assert not (tmp_path / "renamed.x86-64-v4.vmfb").exists()  # an earlier build's module for another CPU


def test_missing_cpu_module_is_a_clear_error(per_cpu, tmp_path, monkeypatch):
    for f in (per_cpu.vmfb, per_cpu.params, per_cpu.manifest):
        (tmp_path / f.name).write_bytes(f.read_bytes())
    monkeypatch.setattr(rt_module.Module, "cpu_variant", property(lambda self: "x86-64-v4"))  # as on an AVX-512 CPU
    with pytest.raises(RuntimeLoadError, match=r"mlp\.x86-64-v4\.vmfb: the x86-64-v4 module .* is missing; keep it beside mlp\.vmfb") as e:
        llmc.load(tmp_path / per_cpu.vmfb.name)
    assert e.value.exit_code == 2


_RUN_MODULES = textwrap.dedent("""
    import sys, torch, llmc
    from llmc.runtime import module
    if sys.argv[2] == "v4":  # as if this CPU had everything the v4 module asks for
        module.Module.cpu_variant = property(lambda self: "x86-64-v4")
    m = llmc.load(sys.argv[1])
    out = m(torch.ones(4, 64))
    print("ran", m._module_file.name, float(out.sum()))
""")


@pytest.mark.skipif(AVX512 or "avx2" not in HAVE, reason="needs an AVX2 CPU without AVX-512 (AVX-512 code must be illegal here)")
def test_the_chosen_module_is_the_one_that_runs(per_cpu):
    """On this AVX2 CPU the v3 module runs; made to pick the v4 module, the process dies of SIGILL
    (its code uses AVX-512), which shows the load runs the chosen CPU's module and nothing else."""
    own = subprocess.run([sys.executable, "-c", _RUN_MODULES, str(per_cpu.vmfb), "own"], capture_output=True, text=True)
    v4 = subprocess.run([sys.executable, "-c", _RUN_MODULES, str(per_cpu.vmfb), "v4"], capture_output=True, text=True)
    assert own.returncode == 0 and "ran mlp.vmfb" in own.stdout, own.stderr[-2000:]
    assert v4.returncode == -4, (v4.returncode, v4.stdout, v4.stderr[-2000:])  # SIGILL


def test_each_cpu_module_links_the_kernels_its_cpu_runs_best(tmp_path, monkeypatch):
    """A modules build links llmc's C kernels once per CPU: the x86-64-v4 module's bf16 one-row products
    call the AVX-512F loop, the x86-64-v3 fallback's the AVX2 one (one link for the whole list would give
    both the AVX2 loop). Both modules give the same values, within the bf16 output's rounding of eager
    with the weights rounded to bf16."""
    from llmc.compiler import iree, lower, ukernels

    why_not = ukernels.unavailable(targets.resolve("cpu", "x86-64-v3", "bf16"))
    if why_not is not None:
        pytest.skip("no C kernels here: " + why_not)
    texts, real = {}, iree.compile_mlir

    def spy(text, path, flags, **kw):
        texts[next(f.split("=", 1)[1] for f in flags if f.startswith("--iree-llvmcpu-target-cpu="))] = text
        return real(text, path, flags, **kw)

    monkeypatch.setattr(lower.iree, "compile_mlir", spy)
    m = _mlp()
    art = llmc.compile(m, (torch.randn(1, 64),), arch="portable", dtype="bf16", output=tmp_path / "mlp.vmfb",
                       dump_ir=tmp_path / "ir")
    monkeypatch.undo()
    assert sorted(texts) == ["x86-64-v3", "x86-64-v4"]
    assert texts["x86-64-v4"].count("func.call @llmc_matvec_bf16_avx512(") == 1 and "@llmc_matvec_bf16(" not in texts["x86-64-v4"]
    assert texts["x86-64-v3"].count("func.call @llmc_matvec_bf16(") == 1 and "_avx512" not in texts["x86-64-v3"]
    # --dump-ir writes each CPU's linked text; the last one is still the main module's (the x86-64-v3 fallback)
    from llmc.compiler.pipeline import Dumper

    assert [p.read_text() for p in (tmp_path / "ir").glob("*-cpu-kernels-x86-64-v4.mlir")] == [texts["x86-64-v4"]]
    assert Dumper.last_mlir(tmp_path / "ir").read_text() == texts["x86-64-v3"]
    x = torch.randn(1, 64)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(p.to(torch.bfloat16).float())
        want = m(x)
    got = {}
    for cpu in (["x86-64-v4"] if AVX512 else []) + ["x86-64-v3"]:
        monkeypatch.setattr(rt_module.Module, "cpu_variant", property(lambda self, cpu=cpu: cpu))
        with llmc.load(art.vmfb) as mod:
            got[cpu] = torch.as_tensor(mod(x))
        assert got[cpu].dtype == torch.bfloat16  # a bf16 build's outputs (the bf16-outputs pass)
        torch.testing.assert_close(got[cpu].float(), want, rtol=2**-8, atol=1e-6)  # the output's own bf16 rounding
    if AVX512:
        assert torch.equal(got["x86-64-v4"], got["x86-64-v3"])  # the two loops' sums are bit-identical


def test_the_fallback_module_is_the_single_cpu_build(tmp_path):
    """A CPU without AVX-512 runs a portable artifact's x86-64-v3 module, which is byte for byte the
    `--arch x86-64-v3` build of the same model (a tiny Llama: its C kernels linked for that CPU, its prefill
    chunk and decode): on such a CPU the portable artifact runs exactly the single-CPU build's code, and only
    the load's choice of file differs (issue: the portable artifact within 5% of the single-CPU build)."""
    from llmc.models.llama.config import get_config
    from llmc.models.llama.model import init_random

    model = init_random(get_config("tiny"), seed=0)
    # bf16: the build whose link differs most between the CPUs (the bf16 one-row loop: AVX2 vs AVX-512F)
    port = llmc.compile(model, dtype="bf16", arch="portable", output=tmp_path / "p.vmfb", max_seq_len=136)
    single = llmc.compile(model, dtype="bf16", arch="x86-64-v3", output=tmp_path / "s.vmfb", max_seq_len=136)
    assert json.loads(port.manifest.read_text())["target"]["cpu_modules"]["x86-64-v3"] == ".vmfb"
    assert port.vmfb.read_bytes() == single.vmfb.read_bytes()
    # and the other CPU's module is code of its own (not the same file twice)
    assert port.vmfb.with_name("p.x86-64-v4.vmfb").read_bytes() != single.vmfb.read_bytes()
