"""
transform.py: the CUDA kernel headers (kernels/*.cuh) as host C++ for dev/emu/emu.h's CPU emulator.
- Kernels and device functions become plain functions: __global__, __device__, __host__ and __launch_bounds__ go.
- __shared__ arrays become function statics, shared by the threads of a CTA; the emulator runs one CTA at a time.
- extern __shared__ becomes the emulator's dynamic shared memory.
- Every launch `k<<<grid, block, smem, stream>>>(args)` becomes `emu_launch(dim3(grid), dim3(block), [&]() { k(args); })`.
- The tensor-core products of kernels/chunk_tiles.cuh are only declared, so only the CUDA-core instantiations can run:
  `if (TC)` becomes `if constexpr (TC)` and the gka kernels' <true> instantiations become <false> (not the
  register-tile ones, whose template argument is not the products' kind).
- The inline PTX of kernels/mma.cuh (ldmatrix, mma.sync, named barriers, cp.async, wgmma) becomes calls of emu.h's
  emulations (a cp.async copies at once: its commit and wait do nothing; so does a wgmma: its fences, commits and
  waits do nothing, and its descriptors carry host addresses).
Usage: python3 dev/emu/transform.py SRC_DIR DST_DIR (every file is copied, the .cuh files transformed)
"""
import re, sys, os
src, dst = sys.argv[1], sys.argv[2]
for root, _, files in os.walk(src):
    for fn in files:
        p = os.path.join(root, fn); q = os.path.join(dst, os.path.relpath(p, src))
        os.makedirs(os.path.dirname(q), exist_ok=True)
        s = open(p).read()
        if fn.endswith('.cuh'):
            s = re.sub(r'extern __shared__ (?:__align__\(\d+\) )?(\w+(?: \w+)?) (\w+)\[\];', r'\1* \2 = (\1*)emu_dynamic_smem();', s)
            if fn == 'chunk_tiles.cuh':   # the tensor-core products: declared only (the emulator runs the CUDA-core ones)
                a = s.index('// bf16 operands: tensor cores'); b = s.index('#endif // TRAIN_KLA_KERNELS_CHUNK_TILES_CUH')
                s = s[:a] + 'template <bool A_T, bool B_T> void cta_mm_tf32(float*, int, const float*, int, const float*, int, int, int, int, bool, bool = true);\n' + s[b:]
            if fn == 'mma.cuh':   # PTX: each function's asm statement becomes its emulation
                calls = {'named_barrier_sync': 'emu_named_barrier(id, threads);', 'ldsm_x4': 'emu_ldsm_x4(r, p, false);',
                         'ldsm_x4_trans': 'emu_ldsm_x4(r, p, true);', 'mma_bf16': 'emu_mma_bf16(c, a, b0, b1);',
                         'cp_async16': 'emu_cp_async16(dst, src, src_bytes);', 'cp_async_commit': '', 'cp_async_wait': '',
                         'wgmma_fence': '', 'fence_proxy_async': '', 'wgmma_commit': '', 'wgmma_wait': '', 'wgmma_hold1': ''}
                for fname, call in calls.items():
                    m = re.search(r'void ' + fname + r'\([^)]*\) \{\n\s*(?:asm volatile|WGMMA_ASM)\((?:.|\n)*?\);\n', s)
                    assert m, fname
                    head = s[m.start():s.index('{', m.start()) + 1]
                    s = s[:m.start()] + head + '\n    ' + call + '\n' + s[m.end():]
                # the wgmma products: bf16 or fp16 (F16) inputs, the body one asm statement per type
                for fname, call in {'wgmma_m64n32k16': 'emu_wgmma(d, 32, desc_a, desc_b, accumulate, F16);',
                                    'wgmma_m64n64k16': 'emu_wgmma(d, 64, desc_a, desc_b, accumulate, F16);',
                                    'wgmma_m64n32k16_rs': 'emu_wgmma_rs(d, 32, a, desc_b, accumulate, F16);',
                                    'wgmma_m64n64k16_rs': 'emu_wgmma_rs(d, 64, a, desc_b, accumulate, F16);'}.items():
                    a = s.index('void ' + fname + '('); b = s.index('\n}\n', a)
                    s = s[:s.index('{', a) + 1] + '\n    ' + call + s[b:]
                s = s.replace('(uint32_t)__cvta_generic_to_shared(p)', '0')
                # wgmma: the emulator is an sm_90a image, and a descriptor carries the tile's host address
                s = s.replace('#if defined(__CUDA_ARCH_FEAT_SM90_ALL)', '#if 1')
                a = s.index('uint64_t wgmma_desc('); b = s.index('\n}\n', a)
                s = s[:s.index('{', a) + 1] + '\n    return emu_wgmma_desc(p + wgmma_tile_off(r0, k0, kd), 16 * kd);' + s[b:]
                adv = '{ return d + (uint64_t)k; }'   # wgmma_desc_advance: 16 k bytes of host address
                assert adv in s
                s = s.replace(adv, '{ return d + 16 * (uint64_t)k; }')
            s = s.replace('__shared__', 'static')
            s = re.sub(r'__launch_bounds__\((?:[^()]|\([^()]*\))*\)', '', s)   # arguments may hold one level of calls
            s = re.sub(r'\b__global__\b', '', s)
            s = re.sub(r'\b__device__\b', '', s)
            s = re.sub(r'\b__host__\b', '', s)
            s = re.sub(r'\b__forceinline__\b', 'inline', s)
            s = s.replace('if (TC) {', 'if constexpr (TC) {')
            s = re.sub(r'(gka_chunk_(?!\w*mma_kernel)\w+_kernel)<true>', r'\1<false>', s)
            # launches: NAME<<<cfg>>>(args);
            out = []; i = 0
            while True:
                j = s.find('<<<', i)
                if j < 0: out.append(s[i:]); break
                m = re.search(r'([\w:.]+(?:<(?:[^<>;()]|\([^()]*\))*>)?)\s*$', s[i:j]); name = m.group(1); start = i + m.start(1)
                k = s.find('>>>', j); cfg = s[j + 3:k]
                assert s[k + 3] == '(', s[k:k + 20]
                depth = 0; e = k + 3
                while True:
                    c = s[e]
                    if c == '(': depth += 1
                    elif c == ')':
                        depth -= 1
                        if depth == 0: break
                    e += 1
                args = s[k + 4:e]
                parts, depth2, cur = [], 0, ''
                for c in cfg:
                    if c == ',' and depth2 == 0: parts.append(cur.strip()); cur = ''; continue
                    depth2 += c == '('; depth2 -= c == ')'; cur += c
                parts.append(cur.strip())
                out.append(s[i:start]); out.append(f'emu_launch(dim3({parts[0]}), dim3({parts[1]}), [&]() {{ {name}({args}); }})')
                i = e + 1
            s = ''.join(out)
        open(q, 'w').write(s)
