# Verified Memory: `make test` is the test command (CI runs it via .ci/run).
# PYTHON can be any CPython 3.9-3.13: make test PYTHON=/path/to/python3.9
PYTHON ?= python3

.PHONY: test bench conformance

test:
	$(PYTHON) -m unittest test_verified_memory test_verify_action

bench:
	$(PYTHON) test_verified_memory.py bench
	$(PYTHON) test_verify_action.py bench

# Optional: public test vectors kept outside the repository (never committed).
VECTORS ?= ../shared/vectors
conformance:
	$(PYTHON) test_verified_memory.py conformance $(VECTORS)
