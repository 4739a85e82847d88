# The two commands people run: `make test` and `make train`. Everything else is CMake.
BUILD ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build test train train-bert bench bench-torch parity parity-transformers fuzz gpu-deps gpu-check clean

all: build

deps:
	@third_party/install-deps.sh

$(BUILD)/build.ninja: | deps
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_FLAGS)

configure: deps
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_FLAGS)

build: $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The main job: ResNet-50 on Fashion-MNIST (Debian's dataset-fashion-mnist, which `deps`
# installs) for under 2 minutes on a 2-core CPU: 8,960 training images in global batches
# of 64, each run as two accumulated micro-batches of 32, then validation on all 10,000
# test images, compiled (kiln::compile; TRAIN_COMPILE= runs it eagerly). Each residual
# block starts as the identity and weight decay spares biases and norm weights (neither is
# PyTorch's default; both keep this short run from scratch stable). Checkpoint, JSON log
# and SVG plot go to $(BUILD)/train. TRAIN_ARGS adds or overrides options:
# make train TRAIN_ARGS="--train-samples 60000 --epochs 3".
TRAIN_ARGS ?=
TRAIN_COMPILE ?= --compile default
train: build
	$(BUILD)/bin/kiln-train --data fashion-mnist --arch resnet50 --train-samples 8960 \
	  --batch 64 --micro-batch 32 --lr 0.05 --warmup 10 --workers 2 $(TRAIN_COMPILE) \
	  --zero-init-residual --weight-decay-scope no-norm-bias \
	  --checkpoint $(BUILD)/train --log $(BUILD)/train/log.jsonl $(TRAIN_ARGS)

# A transformer on text (README, "Train a transformer"): bert-tiny pretrained as a masked
# LM on WordNet's training glosses (Debian's wordnet-base, which `deps` installs; a WordPiece
# vocabulary of 4,096 tokens trained on them first): 1,000 steps of 32 blocks of 64 tokens,
# 40% of the tokens chosen for masking (more to learn from per step than BERT's 15%), AdamW
# with warmup and linear decay. Then, from that checkpoint, fine-tuned for 400 steps to
# name a gloss's lexicographer file (45 classes), validated on the held-out glosses. Both
# compiled; about 3 minutes on a 2-core CPU. Checkpoints, logs and plots go to
# $(BUILD)/train-bert; BERT_ARGS adds options to both runs.
BERT_ARGS ?=
train-bert: build
	$(BUILD)/bin/kiln-train --arch bert-tiny --task mlm --seq-len 64 --batch 32 --steps 1000 \
	  --lr 3e-3 --warmup 60 --mlm-probability 0.4 --workers 1 --compile default \
	  --checkpoint $(BUILD)/train-bert/mlm --log $(BUILD)/train-bert/mlm.jsonl $(BERT_ARGS)
	$(BUILD)/bin/kiln-train --arch bert-tiny --task classify --init $(BUILD)/train-bert/mlm \
	  --seq-len 64 --batch 32 --steps 400 --lr 1e-3 --warmup 30 --workers 1 --compile default \
	  --checkpoint $(BUILD)/train-bert/classify --log $(BUILD)/train-bert/classify.jsonl $(BERT_ARGS)

bench: build
	$(BUILD)/bin/kiln-bench ops
	$(BUILD)/bin/kiln-bench train --arch resnet50 --batch 8 --image-size 64 --device cpu

# kiln against PyTorch on the CPU (README, "Tools"), not part of `make test`: each config's
# training step in PyTorch eager, torch.compile, kiln eager and kiln compiled, interleaved
# (BENCH_ROUNDS rounds of a fresh process per mode, BENCH_STEPS timed steps each, every
# process on BENCH_THREADS threads, all cores by default); a table, and the JSON report in
# $(BUILD)/bench-torch/$(BENCH).json. BENCH=convs times every distinct convolution of the
# ResNet configs instead (forward and both gradients, with each shape's share of a step).
# BENCH_CONFIGS picks some of resnet50-b8-64, resnet18-b64-32, mlp-block-x4,
# resnet50-b32-32 and the transformers bert-mini-b32-128, gpt2-small-b8-128,
# gpt2-mini-b16-128 (PyTorch's side from HF's transformers, which then joins the venv);
# BENCH_ARGS adds options of tools/bench_vs_torch.py (--channels-last, --reps). PyTorch
# runs from a venv outside the build, TORCH_VENV, which tools/torch-venv.sh makes and fills
# from PyPI when it lacks torch or torchvision.
TORCH_VENV ?= $(HOME)/.cache/kiln/torch-venv
BENCH ?= train
BENCH_CONFIGS ?= resnet50-b8-64,resnet18-b64-32,mlp-block-x4,resnet50-b32-32
BENCH_ROUNDS ?= 3
BENCH_STEPS ?= 5
BENCH_THREADS ?= $(shell nproc)
BENCH_ARGS ?=
bench-torch: build
	@extra=$$(case "$(BENCH_CONFIGS)" in *bert*|*gpt2*) echo transformers;; esac) && \
	  python=$$(TORCH_VENV="$(TORCH_VENV)" TORCH_VENV_EXTRA="$$extra" tools/torch-venv.sh) && \
	  python3 tools/bench_vs_torch.py --bench $(BENCH) --configs $(BENCH_CONFIGS) --rounds $(BENCH_ROUNDS) \
	    --steps $(BENCH_STEPS) --threads $(BENCH_THREADS) --kiln-bench $(BUILD)/bin/kiln-bench \
	    --python "$$python" --out $(BUILD)/bench-torch/$(BENCH).json $(BENCH_ARGS)

# ResNet-18 against torchvision (Debian's python3-torch); not part of `make test`, whose
# machines need not download PyTorch. Installs it when run as root.
parity: build
	@/usr/bin/python3 -c "import torch, torchvision" 2>/dev/null || \
	  { [ "$$(id -u)" -eq 0 ] && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-torch python3-torchvision; } || \
	  { echo "kiln: parity needs python3-torch and python3-torchvision (apt-get install them)"; exit 1; }
	cd $(BUILD) && ctest -R parity --output-on-failure

# BERT (masked-LM and classification) and GPT-2 against Hugging Face's transformers at
# small configs with random weights (tests/parity/transformers_parity.py says what is
# compared and the tolerance's derivation): HF's save_pretrained files load into kiln, and
# one training step's loss, logits and every parameter's gradient agree, eager and
# compiled. Not part of `make test`; transformers and safetensors join the PyPI venv of
# bench-torch (TORCH_VENV, filled by tools/torch-venv.sh).
parity-transformers: build
	@python=$$(TORCH_VENV="$(TORCH_VENV)" TORCH_VENV_EXTRA="transformers safetensors" tools/torch-venv.sh) && \
	  "$$python" tests/parity/transformers_parity.py $(BUILD)/bin/kiln-transformers-parity-dump

# The libFuzzer targets of the file readers (tests/fuzz), each run for FUZZ_SECONDS, one
# after another (`make test` runs each for 3 s); FUZZ_TARGETS picks some of json,
# safetensors, ir, idx, jpeg. Needs clang-14 and libclang-rt-14-dev. Crashing inputs go to
# $(BUILD)/tests/fuzz/targets/artifacts/.
FUZZ_SECONDS ?= 600
FUZZ_TARGETS ?=
fuzz: build
	tests/fuzz/run.sh $(BUILD)/tests/fuzz/targets $(FUZZ_SECONDS) $(FUZZ_TARGETS)

# The GPU check (README, "GPU check"): gpu-deps copies the Debian dependencies a bare GPU
# machine lacks into .gpu-deps/ (carried there with the working tree); gpu-check, run on
# that machine, builds with CUDA into build-gpu/, runs the CUDA tests and the benchmarks
# (kiln and PyTorch) and writes log.txt, tests.txt, bench.jsonl, summary.md to $OUT.
gpu-deps:
	@tools/gpu-deps.sh

gpu-check:
	@tools/gpu-check.sh

clean:
	rm -rf $(BUILD)
