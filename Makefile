# paramserv — build, test, demo.  `make help` lists the targets.

CC       ?= cc
SAN      ?= 0
NATIVE   ?= 1
PREFIX   ?= /usr/local
LIBDIR   ?= $(PREFIX)/lib
# make test's fuzz smoke: that every target runs and finds nothing near its
# seeds (a campaign: make fuzz FUZZ_SECONDS=N, which keeps its corpus).
FUZZ_SECONDS ?= 1
# The wire protocol faces the network: its smoke runs longest.
FUZZ_PROTO_SECONDS ?= $(if $(filter command line,$(origin FUZZ_SECONDS)),$(FUZZ_SECONDS),3)

PKGS     := openblas zlib libuv libcrypto inih libxxhash hiredis liblz4 jansson libsystemd libmicrohttpd
ifeq ($(SAN),1)
OBJDIR   := build/san
SANFLAGS := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
# A sanitized build trains about 3 times slower: the chaos scenarios space
# their faults 3 times wider, as many per step as a plain build's
# (fault_gap, tests/integration/lib.bash).
export PS_TEST_FAULT_GAP_SCALE ?= 3
else
OBJDIR   := build
SANFLAGS :=
endif
BUILD    := $(OBJDIR)
ARCHFLAGS := $(if $(filter 1,$(NATIVE)),-march=native,)

# make CUDA=1: the CUDA backend too (src/nn/*.cu through nvcc, cuBLAS and
# the CUDA runtime linked in, PS_HAVE_CUDA defined for src/nn/backend.c,
# the one file that reads it), in build/cuda: the .cu objects, backend.o,
# the GPU tests, the library and the binary.  Every other object is the
# plain build's, in build/, compiled with the same flags (a second copy of
# them cost 45 s of make test).  The default build needs no CUDA.  The
# CUDA build is not sanitized (ASan's protected shadow gap is where the
# CUDA driver maps its memory, unless every run sets
# ASAN_OPTIONS=protect_shadow_gap=0); `make SAN=1 test` still builds and
# runs it (cuda-check), without sanitizers, with the plain objects.
CUDA      ?= 0
CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(CUDA_HOME)/bin/nvcc
# Machine code for sm_90 (H100) and PTX for compute_80, which the driver of
# any newer GPU (A100 up) compiles at load.
CUDA_ARCH ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_80,code=compute_80
ifeq ($(CUDA),1)
ifeq ($(SAN),1)
$(error CUDA=1 with SAN=1: the CUDA build is not sanitized (make SAN=1 test builds it without))
endif
BUILD    := build/cuda
endif

CFLAGS   ?= -O2 -g
CFLAGS   += -std=c11 -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE \
            -Wall -Wextra -Wshadow -Wstrict-prototypes -Werror \
            -fno-math-errno -fPIC -fvisibility=hidden -MMD -MP -Iinclude -Isrc -I. \
            $(ARCHFLAGS) $(SANFLAGS) $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
# SYSLIBS: what the link needs beyond PKGS (paramserv.pc's Libs.private).
SYSLIBS  := -lpthread -lm
PKGLIBS  := $(shell pkg-config --libs $(PKGS) 2>/dev/null)
LDLIBS    = $(PKGLIBS) $(SYSLIBS)
LDFLAGS  += $(SANFLAGS)

# The commands (src/cmd/) are the binary's; the rest is the library's.
LIB_SRC  := $(filter-out src/cmd/%,$(shell find src chief recovery -name '*.c' 2>/dev/null | sort))
LIB_OBJ  := $(LIB_SRC:%.c=$(OBJDIR)/%.o)
CU_SRC   := $(sort $(shell find src -name '*.cu' 2>/dev/null))
GPU_SRC  := $(sort $(wildcard tests/gpu/*.c))
GPU_BIN  := $(GPU_SRC:tests/gpu/%.c=build/cuda/tests/%)
GPU_TESTS := $(filter build/cuda/tests/test_%,$(GPU_BIN))
ifeq ($(CUDA),1)
LIB_OBJ  := $(filter-out $(OBJDIR)/src/nn/backend.o,$(LIB_OBJ)) $(BUILD)/src/nn/backend.o \
            $(CU_SRC:%.cu=$(BUILD)/%.o)
SYSLIBS  += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcudart -lstdc++
NVCCFLAGS := -O2 -g -std=c++20 $(CUDA_ARCH) -DPS_HAVE_CUDA -D_POSIX_C_SOURCE=200809L \
             -D_DEFAULT_SOURCE -Iinclude -Isrc -I. --Werror all-warnings \
             -Xcompiler -Wall,-Wextra,-Wshadow,-Werror,-fno-math-errno,-fPIC,-fvisibility=hidden
endif
# Objects are rebuilt when the compile flags change: one built without
# -fPIC would not link into the shared library.
FLAGS_STAMP := $(OBJDIR)/.flags
$(shell mkdir -p $(OBJDIR) && echo '$(CFLAGS)' | cmp -s - $(FLAGS_STAMP) || \
        echo '$(CFLAGS)' >$(FLAGS_STAMP))
ifeq ($(CUDA),1)
CUDA_STAMP := $(BUILD)/.flags
$(shell mkdir -p $(BUILD) && echo '$(CFLAGS) $(NVCCFLAGS)' | cmp -s - $(CUDA_STAMP) || \
        echo '$(CFLAGS) $(NVCCFLAGS)' >$(CUDA_STAMP))
endif
MAIN_OBJ := $(patsubst %.c,$(OBJDIR)/%.o,$(sort $(wildcard src/cmd/*.c)))
BIN      := $(BUILD)/paramserv
UNIT_SRC := $(sort $(wildcard tests/unit/test_*.c))
UNIT_BIN := $(UNIT_SRC:tests/unit/%.c=$(BUILD)/tests/%)
INTEG_SRC := $(sort $(wildcard tests/integration/*.c))
INTEG_BIN := $(INTEG_SRC:tests/integration/%.c=$(BUILD)/tests/%)
FUZZ_SRC := $(sort $(wildcard tests/fuzz/fuzz_*.c))
FUZZ_BIN := $(FUZZ_SRC:tests/fuzz/%.c=build/fuzz/%)

.SECONDARY:

.PHONY: all deps test unit integration systemd-test fuzz fuzz-smoke demo clean help install \
        cuda-check gpu-tests

# The client library: libparamserv.a and libparamserv.so, of the same
# objects as the binary.  The .so exports only the functions that
# include/paramserv/*.h mark PS_API.  Its version is
# include/paramserv/version.h's (paramserv.pc's Version too), whose MAJOR
# is the soname's number: it grows when the ABI breaks.  With CUDA=1 it
# links cuBLAS and the CUDA runtime too.
version_part = $(shell sed -n 's/^\#define PARAMSERV_VERSION_$(1) \([0-9]*\)/\1/p' \
                 include/paramserv/version.h)
VERSION   := $(call version_part,MAJOR).$(call version_part,MINOR).$(call version_part,PATCH)
SOVERSION := $(call version_part,MAJOR)
SONAME    := libparamserv.so.$(SOVERSION)
SHLIB     := $(BUILD)/libparamserv.so.$(VERSION)

all: $(BIN) $(SHLIB)

help:
	@echo "make demo       install what is missing, build, run the main job"
	@echo "make test       install what is missing, build, run every test"
	@echo "make test T=NAME  one test: a unit test (test_checkpoint), an integration scenario"
	@echo "                (local), a GPU test; CASE=PATTERN: a cmocka test's cases by name"
	@echo "make deps       install the missing Debian packages (apt-get, sudo when not root)"
	@echo "make            build $(BIN) and the client library ($(BUILD)/libparamserv.*)"
	@echo "make SAN=1 test the same under AddressSanitizer + UBSan (objects in build/san)"
	@echo "make CUDA=1     build build/cuda/paramserv with the CUDA backend (nvcc: NVCC=, CUDA_HOME=)"
	@echo "make install    the binary, systemd units, and the client library: headers,"
	@echo "                $(SONAME) and .a, paramserv.pc (PREFIX=$(PREFIX),"
	@echo "                LIBDIR=$(LIBDIR), DESTDIR= to stage)"
	@echo "make cuda-check build the CUDA backend and run the GPU tests (make test runs it;"
	@echo "                without nvcc it says skip, without a GPU each test does)"
	@echo "make fuzz       run every fuzz target for FUZZ_SECONDS (default $(FUZZ_SECONDS)) each,"
	@echo "                the wire protocol's for FUZZ_PROTO_SECONDS (default $(FUZZ_PROTO_SECONDS))"

deps:
	@scripts/deps

# PAR: -jN (N cores) for a build that make test or cuda-check starts, unless
# this make already has a jobserver (make -jN test): read in the recipe,
# where MAKEFLAGS says so.
PAR = $(if $(findstring jobserver,$(MAKEFLAGS)),,-j$(shell nproc 2>/dev/null || echo 1))

# V=1 shows the full commands.
ifneq ($(V),1)
Q := @
endif

$(OBJDIR)/%.o: %.c $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(CFLAGS) -c $< -o $@

ifeq ($(CUDA),1)
$(BUILD)/%.o: %.c $(CUDA_STAMP)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(CFLAGS) -DPS_HAVE_CUDA -c $< -o $@
endif

$(BUILD)/%.o: %.cu $(CUDA_STAMP)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  NVCC    $<")
	$(Q)$(NVCC) $(NVCCFLAGS) -MMD -MP -MF $(@:.o=.d) -c $< -o $@

$(BUILD)/libparamserv.a: $(LIB_OBJ)
	@rm -f $@
	@$(if $(Q),echo "  AR      $@")
	$(Q)ar rcs $@ $^

$(SHLIB): $(LIB_OBJ)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -shared -Wl,-soname,$(SONAME) -Wl,-z,defs -o $@ $^ $(LDLIBS)
	$(Q)ln -sf $(notdir $@) $(BUILD)/$(SONAME) && ln -sf $(SONAME) $(BUILD)/libparamserv.so

$(BIN): $(MAIN_OBJ) $(BUILD)/libparamserv.a
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/tests/integration/%.o $(BUILD)/libparamserv.a
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# Every cmocka test links tests/unit/case_filter.o, which wraps cmocka's
# group runner: CMOCKA_TEST_FILTER=PATTERN runs only the cases it names.
CASE_FILTER := $(BUILD)/tests/unit/case_filter.o
CASE_WRAP   := -Wl,--wrap=_cmocka_run_group_tests

$(BUILD)/tests/%: $(BUILD)/tests/unit/%.o $(CASE_FILTER) $(BUILD)/libparamserv.a
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) $(CASE_WRAP) -o $@ $^ $(LDLIBS) -lcmocka

# The GPU tests and tools (tests/gpu/), linked with the CUDA build's library;
# bench_sgemm times cuBLAS alone for scripts/bench-gpu.
ifeq ($(CUDA),1)
$(BUILD)/tests/%: $(BUILD)/tests/gpu/%.o $(CASE_FILTER) $(BUILD)/libparamserv.a
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) $(CASE_WRAP) -o $@ $^ $(LDLIBS) -lcmocka

$(BUILD)/tests/gpu/bench_sgemm.o: CFLAGS += -I$(CUDA_HOME)/include

gpu-tests: $(GPU_BIN)
else
gpu-tests:
	@$(MAKE) --no-print-directory CUDA=1 SAN=0 gpu-tests
endif

# Compiles the CUDA backend whenever nvcc is here, so that it cannot rot
# unnoticed on machines without a GPU, and runs the GPU tests: each says
# "skip: NAME: no GPU (...)" and exits 77 where the machine has no NVIDIA
# device (a device CUDA cannot use fails).
cuda-check:
	@rm -f $(RESULTS)/cuda-check; mkdir -p $(RESULTS); \
	if [ ! -x "$(NVCC)" ]; then \
	  echo "skip: cuda-check: no nvcc ($(NVCC) not found; set CUDA_HOME or NVCC)"; \
	  echo "skip cuda-check: no nvcc ($(NVCC) not found)" >>$(RESULTS)/cuda-check; \
	elif $(MAKE) --no-print-directory $(PAR) CUDA=1 SAN=0 all gpu-tests; then \
	  echo "pass cuda-build" >>$(RESULTS)/cuda-check; \
	  for t in $(GPU_TESTS); do $(RUN) $(RESULTS)/cuda-check $$t $$t; done; \
	else echo "fail cuda-build exit 1" >>$(RESULTS)/cuda-check; fi; \
	tests/summary $(RESULTS) cuda-check

# Each test runs through tests/run, which appends pass, fail or skip (exit
# 77, with its `skip: NAME: why` line) to $(RESULTS)/<group>; every test of
# a group runs, and tests/summary prints the counts and fails the group on a
# failure.  `make test` runs every group and ends with the whole count; with
# PS_TEST_STRICT=1 (.ci/run) a skip not matched by PS_TEST_ALLOWED_SKIPS
# fails it too.
RESULTS ?= $(BUILD)/results
RUN     := tests/run
TEST_GROUPS := unit cuda-check integration systemd-test fuzz-smoke

# Unit tests run from the project root, so that they can find tests/ data.
# test_check_history.py checks scripts/check-history on hand-made histories.
unit: $(UNIT_BIN)
	@rm -f $(RESULTS)/unit; \
	for t in $(UNIT_BIN) tests/unit/test_check_history.py; do $(RUN) $(RESULTS)/unit $$t $$t; done; \
	tests/summary $(RESULTS) unit

integration: $(BIN) $(INTEG_BIN)
	@rm -f $(RESULTS)/integration; \
	for t in $(sort $(wildcard tests/integration/*.sh)); do \
	  PARAMSERV=$(BIN) $(RUN) $(RESULTS)/integration $$t $$t; done; \
	tests/summary $(RESULTS) integration

# make test T=NAME [CASE=PATTERN]: one test instead of all of them.  NAME is
# a unit test (test_checkpoint, its source or its binary; test_check_history),
# an integration scenario (local or tests/integration/local.sh) or a GPU test
# (test_backend_cuda, built with CUDA=1); CASE, a cmocka test's cases by name
# (a shell pattern: CMOCKA_TEST_FILTER, tests/unit/case_filter.c).  It builds
# what the test needs and runs it through tests/run and tests/summary, as the
# groups do ($(RESULTS)/NAME holds its outcome).
T_NAME  := $(basename $(notdir $(T)))
T_UNIT  := $(filter $(BUILD)/tests/$(T_NAME),$(UNIT_BIN))
T_PY    := $(wildcard tests/unit/$(T_NAME).py)
T_INTEG := $(wildcard tests/integration/$(T_NAME).sh)
T_GPU   := $(filter build/cuda/tests/$(T_NAME),$(GPU_TESTS))
T_PATH  := $(firstword $(T_UNIT) $(T_PY) $(T_INTEG) $(T_GPU))

.PHONY: test-one
test-one:
	$(if $(T_PATH),,$(error make test T=$(T): no such test; the unit tests: \
	  $(notdir $(UNIT_BIN)) test_check_history; the integration scenarios: \
	  $(basename $(notdir $(wildcard tests/integration/*.sh))); the GPU tests: \
	  $(notdir $(GPU_TESTS)); a whole group: make unit, make integration, ...))
	$(if $(CASE),$(if $(T_UNIT)$(T_GPU),,$(error make test T=$(T) CASE=$(CASE): \
	  CASE picks cases of a cmocka test (tests/unit/test_*.c, tests/gpu/test_*.c))))
	@$(if $(T_UNIT),$(MAKE) --no-print-directory $(PAR) $(T_UNIT))
	@$(if $(T_INTEG),$(MAKE) --no-print-directory $(PAR) all $(INTEG_BIN))
	@$(if $(T_GPU),$(MAKE) --no-print-directory $(PAR) CUDA=1 SAN=0 $(T_GPU))
	@rm -f $(RESULTS)/$(T_NAME); \
	CMOCKA_TEST_FILTER='$(CASE)' PARAMSERV=$(BIN) $(RUN) $(RESULTS)/$(T_NAME) $(T_PATH) $(T_PATH); \
	tests/summary $(RESULTS) $(T_NAME)

# Every group runs even when one fails; the build must succeed first.  The
# builds use every core (PAR) unless make already runs with -j: the test
# programs are built before the groups run (one that does not compile
# fails its group, which tries again), and the tests run one at a time.
ifneq ($(T),)
test: test-one
else
test: deps
	@rm -rf $(RESULTS)
	@$(MAKE) --no-print-directory $(PAR) all
	@$(MAKE) --no-print-directory $(PAR) -k $(UNIT_BIN) $(INTEG_BIN) || true
	@for g in unit cuda-check integration systemd-test; do \
	  $(MAKE) --no-print-directory $$g || true; done
	@$(MAKE) --no-print-directory $(PAR) --output-sync=target fuzz-smoke SAN=0 \
	  RESULTS=$(abspath $(RESULTS)) || true
	@echo "== make$(if $(filter 1,$(SAN)), SAN=1,) test"; tests/summary $(RESULTS) $(TEST_GROUPS)
endif

# The units under a real systemd (tests/systemd/run, through
# ../shared/tools/systemd-sandbox); it says "skip: systemd: why" (exit 77)
# when it cannot run.
systemd-test: $(BIN)
	@rm -f $(RESULTS)/systemd-test; \
	PARAMSERV=$(BIN) $(RUN) $(RESULTS)/systemd-test tests/systemd/run tests/systemd/run; \
	tests/summary $(RESULTS) systemd-test

# libFuzzer targets, built with clang (its runtime from libclang-rt-14-dev).
comma := ,
FUZZ_CFLAGS := -std=c11 -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE -g -O1 -Iinclude -Isrc -I. \
               -fsanitize=fuzzer,address,undefined $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
FUZZ_LIB_SRC := $(filter-out src/cmd/%,$(LIB_SRC))
# The library is compiled once for every target (build/fuzz/obj, with the
# same coverage instrumentation: fuzzer-no-link is -fsanitize=fuzzer less
# libFuzzer's main), not once per target: 7 targets had compiled it 7 times.
FUZZ_OBJ := $(FUZZ_LIB_SRC:%.c=build/fuzz/obj/%.o)
FUZZ_STAMP := build/fuzz/.flags
$(shell mkdir -p build/fuzz && echo '$(FUZZ_CFLAGS)' | cmp -s - $(FUZZ_STAMP) || \
        echo '$(FUZZ_CFLAGS)' >$(FUZZ_STAMP))
build/fuzz/obj/%.o: %.c $(FUZZ_STAMP)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  FUZZCC  $<")
	$(Q)clang $(subst -fsanitize=fuzzer$(comma),-fsanitize=fuzzer-no-link$(comma),$(FUZZ_CFLAGS)) \
	  -MMD -MP -c $< -o $@

$(FUZZ_BIN): build/fuzz/%: tests/fuzz/%.c $(FUZZ_OBJ)
	@mkdir -p build/fuzz
	@$(if $(Q),echo "  FUZZ    $@")
	$(Q)clang $(FUZZ_CFLAGS) -MMD -MP -MF build/fuzz/obj/$*.d -o $@ $< $(FUZZ_OBJ) $(LDLIBS)

# Each target's run is a rule of its own (fuzz-run-NAME), so that make -jN
# runs N of them at once (make test does, on every core: the seconds of
# each are the same, the wall time shorter), once every target is built;
# fuzz_proto, the longest, first.
FUZZ_RUNS := $(patsubst build/fuzz/%,fuzz-run-%,$(filter %/fuzz_proto,$(FUZZ_BIN)) \
               $(filter-out %/fuzz_proto,$(FUZZ_BIN)))
.PHONY: fuzz-results-reset $(FUZZ_RUNS)
fuzz-results-reset:
	@rm -f $(RESULTS)/fuzz-smoke; mkdir -p $(RESULTS)

$(FUZZ_RUNS): fuzz-run-%: $(FUZZ_BIN) | fuzz-results-reset
	@f=build/fuzz/$*; n=$*; mkdir -p build/fuzz/corpus-$$n; \
	secs=$(FUZZ_SECONDS); [ $$n = fuzz_proto ] && secs=$(FUZZ_PROTO_SECONDS); \
	echo "== $$f ($$secs s)"; \
	if $$f -max_total_time=$$secs -print_final_stats=0 \
	    build/fuzz/corpus-$$n $$( [ -d tests/fuzz/seeds/$$n ] && echo tests/fuzz/seeds/$$n ) \
	    2>build/fuzz/$$n.log; then echo "pass $$n" >>$(RESULTS)/fuzz-smoke; \
	else tail -40 build/fuzz/$$n.log; echo "fail $$n exit 1" >>$(RESULTS)/fuzz-smoke; fi; \
	grep -E '^(#[0-9]+ *DONE|Done)' build/fuzz/$$n.log | tail -1 || true

fuzz-smoke: $(FUZZ_RUNS)
	@tests/summary $(RESULTS) fuzz-smoke

fuzz: fuzz-smoke

# The whole cluster on this machine (its own redis-server, the chief, 2 shards,
# 2 workers) training the mlp while a random process is killed with kill -9
# every 2-5 s; it ends with the test accuracy, the kills and their recovery
# times, and where the checkpoints are (run directory $(BUILD)/demo).
demo: deps
	@$(MAKE) --no-print-directory all SAN=0
	$(BUILD)/paramserv local --config scripts/demo.conf --chaos --last-step 6000 --dir $(BUILD)/demo --fresh

clean:
	rm -rf build

# make install [PREFIX=/usr/local] [DESTDIR=]: the binary in $(PREFIX)/bin,
# the client library ($(SONAME) and libparamserv.a) in $(LIBDIR)
# with its paramserv.pc in $(LIBDIR)/pkgconfig, its headers in
# $(PREFIX)/include/paramserv, the model files in $(PREFIX)/share/paramserv/models,
# the units in $(UNITDIR) (systemd reads /usr/local/lib/systemd/system and
# /usr/lib/systemd/system; for another PREFIX set UNITDIR=/etc/systemd/system),
# the system user in $(SYSUSERSDIR), the runbook and MODELFILE.md in $(DOCDIR), and
# $(SYSCONFDIR)/paramserv/cluster.conf.example (a cluster.conf is never
# written).  Without DESTDIR, as root, it also creates the user and reloads
# systemd.  systemd/README.md is the runbook.
UNITDIR     ?= $(PREFIX)/lib/systemd/system
SYSUSERSDIR ?= $(PREFIX)/lib/sysusers.d
DOCDIR      ?= $(PREFIX)/share/doc/paramserv
SYSCONFDIR  ?= /etc
UNITS       := paramserv-chief.service paramserv-ps@.service paramserv-worker@.service \
               paramserv.target

install: $(BIN) $(SHLIB) $(BUILD)/libparamserv.a
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(UNITDIR) $(DESTDIR)$(SYSUSERSDIR) \
	  $(DESTDIR)$(DOCDIR) $(DESTDIR)$(SYSCONFDIR)/paramserv \
	  $(DESTDIR)$(PREFIX)/include/paramserv $(DESTDIR)$(LIBDIR)/pkgconfig \
	  $(DESTDIR)$(PREFIX)/share/paramserv/models/examples
	install -m 755 $(BIN) $(DESTDIR)$(PREFIX)/bin/paramserv
	install -m 644 models/*.json $(DESTDIR)$(PREFIX)/share/paramserv/models/
	install -m 644 models/examples/*.json $(DESTDIR)$(PREFIX)/share/paramserv/models/examples/
	install -m 644 src/nn/MODELFILE.md $(DESTDIR)$(DOCDIR)/MODELFILE.md
	install -m 644 include/paramserv/*.h $(DESTDIR)$(PREFIX)/include/paramserv/
	install -m 755 $(SHLIB) $(DESTDIR)$(LIBDIR)/
	ln -sf $(notdir $(SHLIB)) $(DESTDIR)$(LIBDIR)/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(LIBDIR)/libparamserv.so
	install -m 644 $(BUILD)/libparamserv.a $(DESTDIR)$(LIBDIR)/
	@echo "install paramserv.pc -> $(DESTDIR)$(LIBDIR)/pkgconfig/paramserv.pc"
	@printf '%s\n' 'prefix=$(PREFIX)' 'libdir=$(LIBDIR)' 'includedir=$${prefix}/include' \
	  'syslibs=$(SYSLIBS)' '' \
	  'Name: paramserv' \
	  'Description: client of a paramserv cluster: pull weights, push gradients' \
	  'Version: $(VERSION)' 'Cflags: -I$${includedir}' 'Libs: -L$${libdir} -lparamserv' \
	  'Requires.private: $(PKGS)' 'Libs.private: $${syslibs}' \
	  >$(DESTDIR)$(LIBDIR)/pkgconfig/paramserv.pc
	@set -e; for u in $(UNITS); do \
	  echo "install systemd/$$u -> $(DESTDIR)$(UNITDIR)/$$u"; \
	  sed -e 's|/usr/local/bin/paramserv|$(PREFIX)/bin/paramserv|g' \
	      -e 's|/usr/local/share/doc/paramserv|$(DOCDIR)|g' \
	      -e 's|/etc/paramserv/|$(SYSCONFDIR)/paramserv/|g' \
	      systemd/$$u >$(DESTDIR)$(UNITDIR)/$$u.tmp; \
	  chmod 644 $(DESTDIR)$(UNITDIR)/$$u.tmp; \
	  mv -f $(DESTDIR)$(UNITDIR)/$$u.tmp $(DESTDIR)$(UNITDIR)/$$u; \
	done
	install -m 644 systemd/paramserv.sysusers $(DESTDIR)$(SYSUSERSDIR)/paramserv.conf
	install -m 644 systemd/README.md $(DESTDIR)$(DOCDIR)/operations.md
	install -m 644 systemd/cluster.conf $(DESTDIR)$(SYSCONFDIR)/paramserv/cluster.conf.example
	@if [ -z "$(DESTDIR)" ] && [ "$$(id -u)" -eq 0 ]; then \
	  if command -v systemd-sysusers >/dev/null; then \
	    echo "systemd-sysusers $(SYSUSERSDIR)/paramserv.conf"; \
	    systemd-sysusers $(SYSUSERSDIR)/paramserv.conf; fi; \
	  if [ -d /run/systemd/system ]; then echo "systemctl daemon-reload"; systemctl daemon-reload; fi; \
	  if command -v ldconfig >/dev/null; then echo "ldconfig"; ldconfig; fi; \
	fi

-include $(shell find build -name '*.d' 2>/dev/null)
