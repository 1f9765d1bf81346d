# paramserv — build, test, demo.  `make help` lists the targets.

CC       ?= cc
SAN      ?= 0
NATIVE   ?= 1
PREFIX   ?= /usr/local
FUZZ_SECONDS ?= 20
# The wire protocol faces the network: its smoke runs longest.
FUZZ_PROTO_SECONDS ?= $(if $(filter command line,$(origin FUZZ_SECONDS)),$(FUZZ_SECONDS),60)

PKGS     := openblas zlib libuv libcrypto inih libxxhash hiredis liblz4 jansson
ifeq ($(SAN),1)
BUILD    := build/san
SANFLAGS := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
else
BUILD    := build
SANFLAGS :=
endif
ARCHFLAGS := $(if $(filter 1,$(NATIVE)),-march=native,)

CFLAGS   ?= -O2 -g
CFLAGS   += -std=c11 -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE \
            -Wall -Wextra -Wshadow -Wstrict-prototypes -Werror \
            -fno-math-errno -MMD -MP -Iinclude -Isrc -I. $(ARCHFLAGS) $(SANFLAGS) \
            $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
LDLIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null) -lpthread -lm
LDFLAGS  += $(SANFLAGS)

LIB_SRC  := $(filter-out src/cmd/main.c,$(shell find src chief recovery -name '*.c' 2>/dev/null | sort))
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o)
MAIN_OBJ := $(BUILD)/src/cmd/main.o
BIN      := $(BUILD)/paramserv
UNIT_SRC := $(sort $(wildcard tests/unit/test_*.c))
UNIT_BIN := $(UNIT_SRC:tests/unit/%.c=$(BUILD)/tests/%)
INTEG_SRC := $(sort $(wildcard tests/integration/*.c))
INTEG_BIN := $(INTEG_SRC:tests/integration/%.c=$(BUILD)/tests/%)
FUZZ_SRC := $(sort $(wildcard tests/fuzz/fuzz_*.c))
FUZZ_BIN := $(FUZZ_SRC:tests/fuzz/%.c=build/fuzz/%)

.SECONDARY:

.PHONY: all deps test unit integration fuzz fuzz-smoke demo clean help install

all: $(BIN)

help:
	@echo "make demo       install what is missing, build, run the main job"
	@echo "make test       install what is missing, build, run every test"
	@echo "make deps       install the missing Debian packages (apt-get, sudo when not root)"
	@echo "make            build $(BIN)"
	@echo "make SAN=1 test the same under AddressSanitizer + UBSan (objects in build/san)"
	@echo "make fuzz       run every fuzz target for FUZZ_SECONDS (default $(FUZZ_SECONDS)) each,"
	@echo "                the wire protocol's for FUZZ_PROTO_SECONDS (default $(FUZZ_PROTO_SECONDS))"

deps:
	@scripts/deps

# V=1 shows the full commands.
ifneq ($(V),1)
Q := @
endif

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/libparamserv.a: $(LIB_OBJ)
	@rm -f $@
	@$(if $(Q),echo "  AR      $@")
	$(Q)ar rcs $@ $^

$(BIN): $(MAIN_OBJ) $(BUILD)/libparamserv.a
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/tests/integration/%.o $(BUILD)/libparamserv.a
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/tests/unit/%.o $(BUILD)/libparamserv.a
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) -lcmocka

# Unit tests run from the project root, so that they can find tests/ data.
unit: $(UNIT_BIN)
	@set -e; for t in $(UNIT_BIN); do echo "== $$t"; $$t; done

integration: $(BIN) $(INTEG_BIN)
	@set -e; for t in $(sort $(wildcard tests/integration/*.sh)); do \
	  echo "== $$t"; PARAMSERV=$(BIN) $$t; done

test: deps
	@$(MAKE) --no-print-directory all unit integration
	@$(MAKE) --no-print-directory fuzz-smoke SAN=0

# libFuzzer targets, built with clang (its runtime from libclang-rt-14-dev).
FUZZ_CFLAGS := -std=c11 -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE -g -O1 -Iinclude -Isrc -I. \
               -fsanitize=fuzzer,address,undefined $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
FUZZ_LIB_SRC := $(filter-out src/cmd/%,$(LIB_SRC))
build/fuzz/%: tests/fuzz/%.c $(FUZZ_LIB_SRC)
	@mkdir -p build/fuzz
	@$(if $(Q),echo "  FUZZ    $@")
	$(Q)clang $(FUZZ_CFLAGS) -o $@ $< $(FUZZ_LIB_SRC) $(LDLIBS)

fuzz-smoke: $(FUZZ_BIN)
	@set -e; for f in $(FUZZ_BIN); do \
	  n=$$(basename $$f); mkdir -p build/fuzz/corpus-$$n; \
	  secs=$(FUZZ_SECONDS); [ $$n = fuzz_proto ] && secs=$(FUZZ_PROTO_SECONDS); \
	  echo "== $$f ($$secs s)"; \
	  $$f -max_total_time=$$secs -print_final_stats=0 \
	      build/fuzz/corpus-$$n $$( [ -d tests/fuzz/seeds/$$n ] && echo tests/fuzz/seeds/$$n ) \
	      2>build/fuzz/$$n.log || { tail -40 build/fuzz/$$n.log; exit 1; }; \
	  grep -E '^(#[0-9]+ *DONE|Done)' build/fuzz/$$n.log | tail -1 || true; \
	done

fuzz: fuzz-smoke

demo: deps
	@$(MAKE) --no-print-directory all SAN=0
	$(BUILD)/paramserv train --model mlp --epochs 10 --optimizer adam --lr 0.001 --batch 128

clean:
	rm -rf build

-include $(shell find build -name '*.d' 2>/dev/null)
