# Thin wrapper over meson: `make demo` and `make test` are the README's two
# Quick-start commands; both install what is missing first.
.PHONY: demo test build clean
demo:
	@bash scripts/demo.sh
test:
	@bash scripts/test.sh
build:
	@bash scripts/setup.sh build && ninja -C build
clean:
	rm -rf build build-nocuda build-asan build-tsan
