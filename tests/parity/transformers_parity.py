#!/usr/bin/env python3
"""BERT and GPT-2 parity: kiln's logits, loss and gradients against Hugging Face transformers'.

    transformers_parity.py PATH/TO/kiln-transformers-parity-dump [--models bert-mlm,bert-cls,gpt2]

For each model, builds transformers' model at a small config with random weights (a fixed
seed, HF's own initialization with initializer_range 0.1 instead of 0.02, so that GELU and
softmax work outside their near-linear range: HF's tanh GELU in place of BERT's erf one
then misses by 10x the tolerance, at 0.02 by 1.5x; biases and layer norms moved off 0 and
1), saves it with save_pretrained (model.safetensors, the file a user downloads), writes a
batch (input_ids, attention_mask with padding, token_type_ids with two segments for BERT,
labels), runs one training step in torch (forward, HF's own loss from labels=, backward)
and the same step in kiln twice, eager and kiln::compile'd (the dump program), and
compares in float32:

  - the loss, and per tensor the logits and every parameter's gradient:
    max |kiln - torch| <= TOL * max |torch| (relative to the tensor's scale, so that
    elements near zero do not make the check flaky), where

        TOL = 10 * sqrt(S * n) * u,   u = 2^-24 (f32's unit roundoff),

    n the longest sum in the step (the vocabulary, the tokens of the batch or the MLP's
    width, whichever is longest) and S the number of sums one after another on the way
    from the input to the loss and back: per layer 8 (q.k, softmax's sum, p.v, the
    attention's output projection, two MLP products, two layer norms), 6 outside the
    layers (embedding layer norm, head, logsumexp, the loss's mean), all twice (forward and
    backward). Rounding errors of independent sums add like a random walk (sqrt), not in
    the worst case (S * n * u, which would let a wrong GELU variant through); the factor 10
    covers the gain of softmax and layer norm. The figures print with the observed worst.
    BERT's attention.self.key.bias has no gradient in exact arithmetic (softmax ignores a
    constant added to a row of scores): both sides' values are rounding noise, measured
    against the scale of the same layer's key weight gradient.

Dropout is 0 in both (their random streams differ). Exits 0 on a match, 1 on a mismatch
(listing every tensor that differs), and 77 (ctest's SKIP_RETURN_CODE) when torch,
transformers or safetensors cannot be imported.
"""
import argparse
import math
import os
import subprocess
import sys
import tempfile

SKIP = 77
SEED = 0
U = 2.0 ** -24
VOCAB = 1000
BATCH, LENGTH = 3, 16
LENGTHS = [16, 11, 7]  # tokens per sequence; the rest of each row is padding (right)
MODELS = ["bert-mlm", "bert-cls", "gpt2"]


def tolerance(layers, longest_sum):
    stages = 2 * (8 * layers + 6)
    return 10.0 * math.sqrt(stages * longest_sum) * U


def bert_config(transformers, num_labels=2):
    # BERT tiny (models::BertConfig::tiny): 2 layers, hidden 128, 2 heads, intermediate 512.
    return transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=512, max_position_embeddings=64, type_vocab_size=2,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, pad_token_id=0,
        num_labels=num_labels, initializer_range=0.1)


def gpt2_config(transformers):
    # GPT-2 tiny (models::GPT2Config::tiny's sizes): 2 layers, n_embd 128, 2 heads.
    return transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=64, n_embd=128, n_layer=2, n_head=2,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=VOCAB - 1,
        eos_token_id=VOCAB - 1, initializer_range=0.1)


def make_batch(torch, kind):
    """input_ids, attention_mask, token_type_ids, labels (int64), padded on the right."""
    g = torch.Generator().manual_seed(SEED + 1)
    attention_mask = torch.zeros(BATCH, LENGTH, dtype=torch.int64)
    for row, n in enumerate(LENGTHS):
        attention_mask[row, :n] = 1
    input_ids = torch.randint(1, VOCAB, (BATCH, LENGTH), generator=g) * attention_mask  # pad id 0
    # Two segments: the second starts at half of each sequence's tokens.
    token_type_ids = torch.zeros(BATCH, LENGTH, dtype=torch.int64)
    for row, n in enumerate(LENGTHS):
        token_type_ids[row, n // 2:n] = 1
    if kind == "bert-mlm":
        # About 30% of the tokens predicted (more than BERT's 15% so that every row has some);
        # the rest and the padding -100.
        chosen = (torch.rand(BATCH, LENGTH, generator=g) < 0.3) & attention_mask.bool()
        chosen[:, 1] = True
        labels = torch.where(chosen, torch.randint(1, VOCAB, (BATCH, LENGTH), generator=g),
                             torch.full_like(input_ids, -100))
    elif kind == "bert-cls":
        labels = torch.tensor([0, 2, 1])
    else:  # causal LM: the ids themselves, HF shifts them; padding -100
        labels = torch.where(attention_mask.bool(), input_ids, torch.full_like(input_ids, -100))
    return input_ids, attention_mask, token_type_ids, labels


def build(transformers, kind):
    """HF's model, the config entries the dump program reads, and the tolerance."""
    if kind == "gpt2":
        config = gpt2_config(transformers)
        model = transformers.GPT2LMHeadModel(config)
        entries = {k: getattr(config, k) for k in ["vocab_size", "n_positions", "n_embd", "n_layer", "n_head"]}
        longest = max(VOCAB, BATCH * LENGTH, 4 * config.n_embd)
        return model, entries, tolerance(config.n_layer, longest)
    config = bert_config(transformers, num_labels=3)
    model = (transformers.BertForMaskedLM if kind == "bert-mlm" else transformers.BertForSequenceClassification)(config)
    names = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
             "max_position_embeddings", "type_vocab_size", "pad_token_id"]
    entries = {k: getattr(config, k) for k in names}
    if kind == "bert-cls":
        entries["num_labels"] = config.num_labels
    longest = max(VOCAB, BATCH * LENGTH, config.intermediate_size)
    return model, entries, tolerance(config.num_hidden_layers, longest)


def relative_error(actual, expected, scale=None):
    if scale is None:
        scale = float(expected.abs().max()) if expected.numel() else 0.0
    error = float((actual.double() - expected.double()).abs().max()) if expected.numel() else 0.0
    return error / scale if scale > 0 else error


def check(kind, dump, tmp):
    import torch
    import transformers
    from safetensors.torch import save_file, load_file

    torch.manual_seed(SEED)
    model, config_entries, tol = build(transformers, kind)
    model = model.float()
    # HF starts biases and layer norms at 0 and 1, where a bias loaded into the wrong place
    # would go unseen: every 1-d parameter moves by N(0, 0.1^2).
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    folder = os.path.join(tmp, kind)
    model.save_pretrained(folder)  # before the step: the weights kiln loads are the ones torch runs
    weights = os.path.join(folder, "model.safetensors")

    input_ids, attention_mask, token_type_ids, labels = make_batch(torch, kind)
    batch = {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}
    if kind != "gpt2":
        batch["token_type_ids"] = token_type_ids
    batch.update({"config." + k: torch.tensor(v, dtype=torch.int64) for k, v in config_entries.items()})
    batch_path = os.path.join(tmp, kind + "-batch.safetensors")
    save_file(batch, batch_path)

    model.train()
    inputs = {k: v for k, v in batch.items() if not k.startswith("config.")}
    out = model(**inputs)
    out.loss.backward()
    loss = float(out.loss.detach())
    expected = {"logits": out.logits.detach()}
    expected.update({"grad." + name: p.grad for name, p in model.named_parameters()})

    failures, worst = [], {}
    for mode in ["eager", "compiled"]:
        out_path = os.path.join(tmp, f"{kind}-{mode}.safetensors")
        subprocess.run([dump, kind, weights, batch_path, out_path] + (["--compile"] if mode == "compiled" else []),
                       check=True)
        kiln = load_file(out_path)
        loss_error = abs(float(kiln["loss"]) - loss) / abs(loss)
        worst[mode] = ("loss", loss_error)
        if loss_error > tol:
            failures.append(f"{kind} {mode} loss: kiln {float(kiln['loss']):.8g} torch {loss:.8g}")
        for name, value in expected.items():
            if value is None:
                failures.append(f"{kind} {mode} {name}: torch computed no gradient")
                continue
            if name not in kiln:
                failures.append(f"{kind} {mode} {name}: missing from kiln's output")
                continue
            if tuple(kiln[name].shape) != tuple(value.shape):
                failures.append(f"{kind} {mode} {name}: shape {tuple(kiln[name].shape)} != {tuple(value.shape)}")
                continue
            # BERT's key bias gets no gradient in exact arithmetic (it adds q.b to a whole row
            # of scores, which softmax ignores), so both sides are rounding noise (~1e-11 against
            # the key weight's ~1e-4): measured against the key weight's gradient instead.
            scale = None
            if name.endswith("attention.self.key.bias"):
                scale = float(expected[name[:-len("bias")] + "weight"].abs().max())
            error = relative_error(kiln[name], value, scale)
            if error > worst[mode][1]:
                worst[mode] = (name, error)
            if not error <= tol:
                failures.append(f"{kind} {mode} {name}: max |diff| / max |torch| {error:.3e} > {tol:.3e}")
        failures += [f"{kind} {mode} {name}: in kiln's output, not torch's"
                     for name in sorted(set(kiln) - set(expected) - {"loss"})]
    print(f"{kind}: loss {loss:.6f}, {len(expected)} tensors and the loss compared, "
          f"tolerance {tol:.2e}; worst: " +
          ", ".join(f"{mode} {name} {error:.2e}" for mode, (name, error) in worst.items()))
    return failures


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("dump")
    parser.add_argument("--models", default=",".join(MODELS))
    args = parser.parse_args(argv[1:])
    kinds = args.models.split(",")
    unknown = [k for k in kinds if k not in MODELS]
    if unknown:
        parser.error(f"--models: unknown {', '.join(unknown)} (expected some of {', '.join(MODELS)})")
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
        import safetensors  # noqa: F401
    except Exception as e:  # any failure to import means there is nothing to compare against
        print(f"SKIP: torch, transformers or safetensors not importable ({e})")
        return SKIP
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in kinds:
            failures += check(kind, args.dump, tmp)
    for line in failures:
        print("MISMATCH " + line)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
