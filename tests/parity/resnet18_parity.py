#!/usr/bin/python3
"""ResNet-18 parity: kiln's loss, logits, gradients and BatchNorm buffers against torchvision's.

    resnet18_parity.py PATH/TO/kiln-resnet18-parity-dump

Builds torchvision's resnet18 (10 classes) with a fixed seed, writes its state dict and a
fixed batch (4 x 3 x 64 x 64, so that layer4's BatchNorm still sees 2 x 2 positions per
image) to a safetensors file, runs one training step in torch and one in kiln (the dump
program), and compares in float32:

  - loss: |kiln - torch| <= 1e-4 * |torch|
  - logits, every parameter's gradient and every buffer after the step: per tensor,
    max |kiln - torch| <= 1e-4 * max |torch| (relative to the tensor's scale, so that
    elements near zero do not make the check flaky); num_batches_tracked exactly.

Exits 0 on a match, 1 on a mismatch (listing every tensor that differs), and 77 (ctest's
SKIP_RETURN_CODE) when torch or torchvision cannot be imported.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

SKIP = 77
RTOL = 1e-4
SEED = 0
BATCH, CLASSES, SIZE = 4, 10, 64

# ---- safetensors, by hand: 8-byte little-endian header length, JSON header, raw bytes ----
# Entries are (dtype name, shape, little-endian bytes), so this part needs no torch.


def write_safetensors(path, entries):
    """Writes {name: (dtype, shape, raw bytes)} as a safetensors file."""
    header, offset = {}, 0
    for name in sorted(entries):
        dtype, shape, data = entries[name]
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name in sorted(entries):
            f.write(entries[name][2])


def read_safetensors(path):
    """Reads a safetensors file into {name: (dtype, shape, raw bytes)}."""
    with open(path, "rb") as f:
        blob = f.read()
    (length,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + length])
    header.pop("__metadata__", None)
    data = blob[8 + length:]
    return {name: (info["dtype"], info["shape"], data[info["data_offsets"][0]:info["data_offsets"][1]])
            for name, info in header.items()}


# ---- torch tensors <-> safetensors entries ----

def torch_dtypes():
    import torch
    return {torch.float32: "F32", torch.int64: "I64"}


def to_entry(t):
    import torch
    t = t.detach().cpu().contiguous()
    try:
        data = t.numpy().tobytes()
    except (ImportError, RuntimeError):  # torch built without numpy: slow but correct
        data = bytes(t.reshape(-1).view(torch.uint8).tolist()) if t.numel() else b""
    return torch_dtypes()[t.dtype], tuple(t.shape), data


def from_entry(entry):
    import torch
    dtype_name, shape, data = entry
    dtype = {name: dtype for dtype, name in torch_dtypes().items()}[dtype_name]
    if not data:
        return torch.zeros(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=dtype).reshape(shape)


# ---- the check ----

def torch_step(model, images, target):
    """One training-mode step; returns loss, logits, {name: grad} and {name: buffer}."""
    import torch
    model.train()
    logits = model(images)
    loss = torch.nn.functional.cross_entropy(logits, target)
    loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    buffers = dict(model.named_buffers())
    return loss.detach(), logits.detach(), grads, buffers


def mismatch(name, actual, expected):
    """A line describing how `actual` misses `expected`, or None when within tolerance."""
    if tuple(actual.shape) != tuple(expected.shape):
        return f"{name}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    if not expected.dtype.is_floating_point:
        return None if bool((actual == expected).all()) else f"{name}: {actual} != {expected}"
    scale = float(expected.abs().max()) if expected.numel() else 0.0
    error = float((actual - expected).abs().max()) if expected.numel() else 0.0
    if error <= RTOL * scale:
        return None
    return f"{name}: max |diff| {error:.3e} > {RTOL:g} * max |torch| {scale:.3e}"


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    try:
        import torch
        import torchvision
    except Exception:  # any failure to import means there is nothing to compare against
        print("SKIP: torch/torchvision not importable")
        return SKIP
    dump = argv[1]

    torch.manual_seed(SEED)
    model = torchvision.models.resnet18(num_classes=CLASSES).float()
    images = torch.randn(BATCH, 3, SIZE, SIZE)
    target = torch.randint(0, CLASSES, (BATCH,))

    with tempfile.TemporaryDirectory() as tmp:
        in_path, out_path = os.path.join(tmp, "in.safetensors"), os.path.join(tmp, "out.safetensors")
        # The weights are written before torch's step, which moves the running statistics.
        entries = {"model." + k: to_entry(v) for k, v in model.state_dict().items()}
        entries["input"], entries["target"] = to_entry(images), to_entry(target)
        write_safetensors(in_path, entries)

        loss, logits, grads, buffers = torch_step(model, images, target)

        subprocess.run([dump, in_path, out_path], check=True)
        kiln = {name: from_entry(e) for name, e in read_safetensors(out_path).items()}

    failures = []
    loss_error = abs(float(kiln["loss"]) - float(loss))
    if loss_error > RTOL * abs(float(loss)):
        failures.append(f"loss: kiln {float(kiln['loss']):.8g} torch {float(loss):.8g}")
    expected = {"logits": logits}
    expected.update({"grad." + k: v for k, v in grads.items()})
    expected.update({"buffer." + k: v for k, v in buffers.items()})
    for name, value in expected.items():
        if name not in kiln:
            failures.append(f"{name}: missing from kiln's output")
            continue
        line = mismatch(name, kiln[name], value)
        if line:
            failures.append(line)
    extra = sorted(set(kiln) - set(expected) - {"loss"})
    failures += [f"{name}: in kiln's output, not torch's" for name in extra]

    print(f"compared loss and {len(expected)} tensors (loss {float(loss):.6f})")
    for line in failures:
        print("MISMATCH " + line)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
