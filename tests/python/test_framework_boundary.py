"""Only frameworks/ (and the reference workload, which builds the job) knows a training
framework: no code elsewhere in the package names DDP, FSDP, DTensor, torch.optim
internals, Megatron, DeepSpeed or TorchTitan. Comments and docstrings may explain them."""

import io
import os
import tokenize

import lm_resiliency

PACKAGE = os.path.dirname(lm_resiliency.__file__)
ALLOWED = ("frameworks", "workloads")

# Names that only a framework adapter may use.
FORBIDDEN_NAMES = {
    "DistributedDataParallel", "DDP", "FSDP", "FSDPModule", "fully_shard", "DTensor", "device_mesh", "to_local",
    "full_tensor", "placements", "param_groups", "register_comm_hook", "megatron", "deepspeed", "torchtitan",
}
# Dotted names (module paths) likewise.
FORBIDDEN_DOTTED = ("torch.optim", "torch.distributed.fsdp", "torch.distributed.tensor", "nn.parallel")


def code_tokens(path):
    """(line, text) of every name in `path`, with dotted chains joined; strings and
    comments are not code."""
    with open(path, encoding="utf-8") as f:
        tokens = list(tokenize.generate_tokens(io.StringIO(f.read()).readline))
    out, chain, line = [], [], 0
    for tok in tokens:
        if tok.type == tokenize.NAME:
            if not chain:
                line = tok.start[0]
            chain.append(tok.string)
        elif tok.type == tokenize.OP and tok.string == "." and chain:
            continue
        else:
            if chain:
                out.append((line, ".".join(chain)))
            chain = []
    return out


def offenders(root):
    found = []
    for folder, _, files in os.walk(root):
        rel = os.path.relpath(folder, root)
        if rel.split(os.sep)[0] in ALLOWED:
            continue
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            for line, dotted in code_tokens(path):
                parts = dotted.split(".")
                bad = [p for p in parts if p in FORBIDDEN_NAMES]
                bad += [d for d in FORBIDDEN_DOTTED if dotted == d or dotted.startswith(d + ".") or f".{d}" in dotted]
                if bad:
                    found.append(f"{os.path.relpath(path, root)}:{line}: {dotted}")
    return found


def test_no_framework_names_outside_frameworks():
    assert offenders(PACKAGE) == []


def test_the_check_sees_a_framework_name(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "scout").mkdir(parents=True)
    (pkg / "scout" / "bad.py").write_text('import torch\n"""DTensor in a docstring is fine"""\n'
                                          "x = torch.optim.AdamW  # torch.optim in a comment is fine\n"
                                          "y = p.to_local()\n")
    (pkg / "frameworks").mkdir()
    (pkg / "frameworks" / "ok.py").write_text("z = p.to_local()\n")
    assert offenders(str(pkg)) == ["scout/bad.py:3: torch.optim.AdamW", "scout/bad.py:4: p.to_local"]
