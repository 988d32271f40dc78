# tokenloop build. `make` builds the library and the binary; `make test` sets up
# (models, Python test deps) and runs the whole suite; `make run` streams an answer.
CC      ?= cc
BUILD   ?= build
OPT     ?= -O2
SAN     ?=
WARN    = -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
          -Wno-unused-parameter
# -ffp-contract=off: gcc and clang must not fuse a*b+c on their own; kernels
# say where they fuse, so every build rounds the same way.
CFLAGS  = -std=c11 $(OPT) -g $(WARN) -ffp-contract=off -D_GNU_SOURCE -Iinclude -Isrc -Iserver -fPIC -MMD -MP $(SAN)
LDFLAGS = $(SAN)
# jansson: the library reads JSON Schemas (src/grammar/schema.c)
LDLIBS  = -lpcre2-8 -ljansson -lnettle -lm -lpthread
# The server (server/*.c) adds its HTTP library.
SERVER_LIBS = -lmicrohttpd

# src/ is laid out by stage of the loop (docs/DESIGN.md has the map): every
# folder's files go into the library.
LIB_SRC  = $(wildcard src/*.c) $(wildcard src/*/*.c)
SERVER_SRC = $(wildcard server/*.c)
CLI_SRC  = $(wildcard cli/*.c)
TEST_SRC = $(wildcard tests/unit/test_*.c)
TOOL_SRC = $(wildcard tests/tools/*.c)

LIB_OBJ  = $(LIB_SRC:%.c=$(BUILD)/%.o)
SERVER_OBJ = $(SERVER_SRC:%.c=$(BUILD)/%.o) $(BUILD)/server/page_html.o
CLI_OBJ  = $(CLI_SRC:%.c=$(BUILD)/%.o)
TEST_BIN = $(TEST_SRC:tests/unit/%.c=$(BUILD)/tests/%)
TOOL_BIN = $(TOOL_SRC:tests/tools/%.c=$(BUILD)/tools/%)

# Per-ISA kernel files are the only ones compiled with wider instruction sets;
# the rest of the binary runs on any x86-64 and picks kernels at run time.
$(BUILD)/src/cpu/kern_avx2.o:   ISA = -mavx2 -mfma -mf16c
$(BUILD)/src/cpu/kern_avx512.o: ISA = -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mavx512bf16 -mavx2 -mfma -mf16c
$(BUILD)/src/cpu/kern_amx.o:    ISA = -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mamx-tile -mamx-int8 -mavx2 -mfma -mf16c

# The AVX-512 kernels checked on any AVX2 machine: the kernel test linked with
# kern_avx512.c compiled against SIMDe's emulation and a detector that reports
# AVX-512 VNNI (built when SIMDe's headers are installed: libsimde-dev).
SIMDE_BIN = $(if $(wildcard /usr/include/simde/x86/avx512.h),$(BUILD)/simde/test_kernels_bench)
SIMDE_LIB = $(filter-out $(BUILD)/src/cpu/kern_avx512.o $(BUILD)/src/cpu/dispatch.o,$(LIB_OBJ))

.PHONY: all lib test unit run models clean asan format fixtures
# ./tokenloop is the default build's binary: `make asan` or a clang build
# (another BUILD) leaves it alone rather than putting a sanitized one there.
all: $(BUILD)/libtokenloop.a $(BUILD)/libtlserver.a $(BUILD)/tokenloop $(if $(filter build,$(BUILD)),tokenloop) \
     $(TEST_BIN) $(TOOL_BIN) $(SIMDE_BIN)

# SIMDe makes every intrinsic an inline function: at -O2 with full debug info
# gcc 12 spent ~30 minutes of one core on this object under the sanitizers
# (CI's longest step, 2026-12-07; 3.3 minutes without them) for a test that
# then ran 9 s. At -O1 with line tables only (-g1: sanitizer reports still
# name the lines) 3.3 minutes under them, 1.2 without, and the test 37-60 s.
# The bits do not depend on the level (no fp contraction, no fast-math).
$(BUILD)/simde/kern_avx512_emu.o: tests/simde/kern_avx512_emu.c src/cpu/kern_avx512.c src/cpu/tile32.h src/cpu/r8_tile.h src/cpu/pair512.h src/cpu/attn512.h src/cpu/mathfn.h src/cpu/simd256.h src/cpu/kernels.h src/quant/quant.h
	@mkdir -p $(dir $@)
	$(CC) $(filter-out -Werror -g $(OPT),$(CFLAGS)) -O1 -g1 -w -mavx2 -mfma -mf16c -c $< -o $@

$(BUILD)/simde/dispatch.o: src/cpu/dispatch.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Dtl_cpu_detect=tl_cpu_detect_native -c $< -o $@

$(BUILD)/simde/test_kernels_bench: $(BUILD)/tests/unit/test_kernels_bench.o $(SIMDE_LIB) $(BUILD)/simde/kern_avx512_emu.o $(BUILD)/simde/dispatch.o $(BUILD)/tests/simde/detect_emu.o
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

lib: $(BUILD)/libtokenloop.a

# The library as a shared object for the Python package (python/, docs/PYTHON.md):
# the same objects (CFLAGS has -fPIC), every dependency resolved at link time.
$(BUILD)/libtokenloop.so: $(LIB_OBJ)
	$(CC) $(LDFLAGS) -shared -Wl,-z,defs -Wl,-soname,libtokenloop.so -o $@ $^ $(LDLIBS)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(ISA) -c $< -o $@

$(BUILD)/libtokenloop.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

# The live page (server/page.html) as bytes in the binary: no other file to
# ship, no JavaScript build step.
$(BUILD)/server/page_html.c: server/page.html
	@mkdir -p $(dir $@)
	@{ echo '/* generated from server/page.html by the Makefile */'; echo '#include <stddef.h>'; \
	  echo 'extern const char srv_page_html[]; extern const size_t srv_page_len;'; \
	  echo 'const char srv_page_html[] = {'; od -An -v -tx1 $< | sed 's/ *\([0-9a-f][0-9a-f]\)/0x\1,/g'; \
	  echo '0};'; echo 'const size_t srv_page_len = sizeof srv_page_html - 1;'; } > $@

$(BUILD)/server/page_html.o: $(BUILD)/server/page_html.c
	$(CC) $(CFLAGS) -c $< -o $@

# `tokenloop serve` and its tests: HTTP, JSON, scheduler and metrics.
$(BUILD)/libtlserver.a: $(SERVER_OBJ)
	@rm -f $@
	ar rcs $@ $^

tokenloop: $(BUILD)/tokenloop
	cp $< $@

$(BUILD)/tokenloop: $(CLI_OBJ) $(BUILD)/libtlserver.a $(BUILD)/libtokenloop.a
	$(CC) $(LDFLAGS) -o $@ $(CLI_OBJ) $(BUILD)/libtlserver.a $(BUILD)/libtokenloop.a $(SERVER_LIBS) $(LDLIBS)

# The server's unit tests link the server library too (the shorter stem wins).
$(BUILD)/tests/test_server_%: $(BUILD)/tests/unit/test_server_%.o $(BUILD)/libtlserver.a $(BUILD)/libtokenloop.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $< $(BUILD)/libtlserver.a $(BUILD)/libtokenloop.a $(SERVER_LIBS) $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/tests/unit/%.o $(BUILD)/libtokenloop.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $< $(BUILD)/libtokenloop.a $(LDLIBS)

# Test-only helpers (they may use internal headers), e.g. tensor dumps for the
# Python checks against the gguf package.
$(BUILD)/tools/%: $(BUILD)/tests/tools/%.o $(BUILD)/libtokenloop.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $< $(BUILD)/libtokenloop.a $(LDLIBS)

# Installs what is missing (Debian packages, Python test deps), fetches models.
setup:
	@scripts/setup.sh

models:
	@scripts/fetch-models.sh

test:
	@scripts/setup.sh && scripts/fetch-models.sh
	@$(MAKE) --no-print-directory all
	@tests/run.sh $(BUILD)

# The unit tests alone, no models or Python needed.
unit: all
	@tests/run.sh $(BUILD) --unit

# The suite under AddressSanitizer + UndefinedBehaviorSanitizer.
asan:
	$(MAKE) BUILD=build-asan OPT=-O2 SAN="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer" all
	@TL_ASAN=1 tests/run.sh build-asan

run:
	@scripts/setup.sh && scripts/fetch-models.sh
	@$(MAKE) --no-print-directory all >/dev/null
	@./tokenloop run -n 96 --chat -p "$${PROMPT:-What is the capital of France? Answer in two sentences.}"

fixtures:
	@tests/oracle/make_fixtures.sh

format:
	clang-format -i include/*.h $(wildcard src/*.[ch] src/*/*.[ch]) server/*.[ch] cli/*.[ch] tests/unit/*.[ch]

clean:
	rm -rf $(BUILD) build-asan tokenloop

-include $(LIB_OBJ:.o=.d) $(SERVER_OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(TOOL_SRC:%.c=$(BUILD)/%.d) $(TEST_BIN:$(BUILD)/tests/%=$(BUILD)/tests/unit/%.d)
