// Dump the float32 logits llama.cpp computes for the scored rows of a --kl-divergence-base file (run by hand,
// from tools/llamacpp/export_check.py): the chunks' token ids are evaluated as llama-perplexity evaluates them
// (one chunk per decode, BOS at position 0 when the vocab adds one, outputs only for positions n_ctx/2 ..
// n_ctx-1, context of n_ctx, batch n_ctx, library defaults otherwise) and rows n_ctx/2 .. n_ctx-2 of each chunk
// are written as raw little-endian float32 [n_chunk, n_ctx-1-n_ctx/2, n_vocab]. Written against llama.h only;
// nothing of llama.cpp is copied.
//
//   g++ -O2 -std=c++17 -I$SRC/include -I$SRC/ggml/include dump_logits.cpp -L$BIN -lllama -Wl,-rpath,$BIN -o dump_logits
//   ./dump_logits MODEL.gguf BASE.kld OUT.f32 [threads]
#include "llama.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

int main(int argc, char ** argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s MODEL.gguf BASE.kld OUT.f32 [threads]\n", argv[0]);
        return 2;
    }
    const int threads = argc > 4 ? atoi(argv[4]) : 2;
    FILE * in = fopen(argv[2], "rb");
    char magic[8];
    int32_t head[3];
    if (!in || fread(magic, 1, 8, in) != 8 || memcmp(magic, "_logits_", 8) != 0 || fread(head, 4, 3, in) != 3) {
        fprintf(stderr, "%s: not a --kl-divergence-base file\n", argv[2]);
        return 1;
    }
    const int n_ctx = head[0], n_chunk = head[2], first = n_ctx / 2;
    std::vector<llama_token> tokens((size_t) n_ctx * n_chunk);
    if (fread(tokens.data(), 4, tokens.size(), in) != tokens.size()) {
        fprintf(stderr, "%s: truncated\n", argv[2]);
        return 1;
    }
    fclose(in);

    llama_backend_init();
    llama_model * model = llama_model_load_from_file(argv[1], llama_model_default_params());
    if (!model) {
        return 1;
    }
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = n_ctx;
    cp.n_ubatch = n_ctx;
    cp.n_seq_max = 1;
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    llama_context * ctx = llama_init_from_model(model, cp);
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    if (n_vocab != head[1]) {
        fprintf(stderr, "vocab %d, file says %d\n", n_vocab, head[1]);
        return 1;
    }
    FILE * out = fopen(argv[3], "wb");
    llama_batch batch = llama_batch_init(n_ctx, 0, 1);
    for (int c = 0; c < n_chunk; ++c) {
        llama_memory_clear(llama_get_memory(ctx), true);
        batch.n_tokens = 0;
        for (int k = 0; k < n_ctx; ++k) {
            llama_token t = tokens[(size_t) c * n_ctx + k];
            if (k == 0 && llama_vocab_get_add_bos(vocab)) {
                t = llama_vocab_bos(vocab);
            }
            const int i = batch.n_tokens++;
            batch.token[i] = t;
            batch.pos[i] = k;
            batch.n_seq_id[i] = 1;
            batch.seq_id[i][0] = 0;
            batch.logits[i] = k >= first;
        }
        if (llama_decode(ctx, batch) != 0) {
            fprintf(stderr, "decode failed on chunk %d\n", c);
            return 1;
        }
        for (int k = first; k < n_ctx - 1; ++k) {
            fwrite(llama_get_logits_ith(ctx, k), sizeof(float), n_vocab, out);
        }
    }
    fclose(out);
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
