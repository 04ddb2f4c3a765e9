# Thin wrapper over meson: `make demo` and `make test` are the README's two
# Quick-start commands; both install what is missing first.
.PHONY: demo test build clean gpu-check
demo:
	@bash scripts/demo.sh
test:
	@bash scripts/test.sh
build:
	@bash scripts/setup.sh build && ninja -C build
# On a machine with an NVIDIA GPU: build for it, gpu tests, zinc vs PyTorch,
# benchmarks; one results file in bench/results/ (exit 77 without a GPU).
gpu-check:
	@bash scripts/gpu-check.sh
clean:
	rm -rf build build-nocuda build-asan build-tsan build-fuzz
