/* ct/llmc.h: the file formats of Karpathy's llm.c (github.com/karpathy/llm.c).
 *
 * Three formats, each a 256-word little-endian header and a body
 * (docs/llmc.md has the layouts and where in llm.c each is defined):
 *   - token shards, the .bin files of llm.c's dev/data scripts
 *     (tinyshakespeare, fineweb, ...): magic 20240520, uint16 tokens. A
 *     ct_llmc_tokens maps any number of them read-only and presents them as
 *     one flat token sequence, with random-access windows and a streaming
 *     loader that cuts batches exactly as llm.c's DataLoader does;
 *   - the GPT-2 model checkpoint (gpt2_124M.bin, magic 20240326), read into
 *     and written from a ct_gpt (ct/nn.h), float32 (version 3) or bfloat16
 *     (version 5);
 *   - the GPT-2 tokenizer (gpt2_tokenizer.bin, magic 20240328), for turning
 *     token ids back into bytes.
 *
 * The example writes a shard by hand, streams it in batches, and sends a
 * model to llm.c's format and back. On real data the pattern would be
 * "dev/data/fineweb10B/fineweb_train_*.bin" and the model gpt2_124M.bin.
 *
 * Example:
 *
 *     #define _POSIX_C_SOURCE 200809L
 *     #include <ct/llmc.h>
 *     #include <stdint.h>
 *     #include <stdio.h>
 *     #include <stdlib.h>
 *
 *     int main(void) {
 *         char dir[] = "/tmp/ct_llmc_XXXXXX", shard[64], model[64];
 *         if (!mkdtemp(dir))
 *             return 1;
 *         snprintf(shard, sizeof shard, "%s/tiny_train.bin", dir);
 *         snprintf(model, sizeof model, "%s/model.bin", dir);
 *         int32_t header[256] = {CT_LLMC_TOKENS_MAGIC, CT_LLMC_TOKENS_VERSION, 4096};
 *         uint16_t tokens[4096];
 *         for (int i = 0; i < 4096; i++)
 *             tokens[i] = (uint16_t)(i % 50);
 *         FILE *f = fopen(shard, "wb");
 *         if (!f || fwrite(header, sizeof header, 1, f) != 1 ||
 *             fwrite(tokens, sizeof tokens, 1, f) != 1 || fclose(f))
 *             return 1;
 *         ct_llmc_tokens *train = ct_llmc_tokens_open(shard);
 *         ct_llmc_loader *loader = NULL;
 *         if (train && ct_llmc_tokens_set_vocab(train, 50) == 0)
 *             loader = ct_llmc_loader_new(
 *                 train, &(ct_llmc_loader_options){.batch = 4, .context = 64, .num_ranks = 1});
 *         ct_gpt_config cfg = {.vocab = 50, .context = 64, .layers = 1, .heads = 2, .width = 16};
 *         ct_module *gpt = loader ? ct_gpt_new(&cfg) : NULL;
 *         ct_module *back = gpt && ct_llmc_gpt_save(gpt, model) == 0
 *                               ? ct_llmc_gpt_load(model, NULL) : NULL;
 *         int rc = back ? 0 : 1;
 *         for (int step = 0; step < 3 && rc == 0; step++) {
 *             ct_scope_begin();
 *             ct_tensor *x, *y; // int64 [4, 64] each
 *             rc = ct_llmc_loader_next(loader, &x, &y);
 *             ct_tensor *logits = rc ? NULL : ct_module_forward(back, x);
 *             if (!rc && !logits)
 *                 rc = ct_errcode();
 *             ct_scope_end();
 *         }
 *         if (rc)
 *             fprintf(stderr, "%s\n", ct_errmsg());
 *         ct_module_free(back);
 *         ct_module_free(gpt);
 *         ct_llmc_loader_free(loader);
 *         ct_llmc_tokens_free(train);
 *         remove(shard);
 *         remove(model);
 *         remove(dir);
 *         return rc ? 1 : 0;
 *     }
 *
 * Files are hostile input. Every header field is checked before it sizes
 * anything, a body must be exactly as long as its header says, and each
 * error message names the file. Files are opened with O_NOFOLLOW: a
 * symbolic link as the last component of a path is refused, as are FIFOs,
 * directories and devices. All data is little-endian; ct builds only on
 * little-endian hosts.
 *
 * Errors: CT_EINVAL for bad arguments; CT_EIO when a file cannot be opened,
 * mapped, read or written (the system's reason is kept); CT_ECORRUPT for a
 * file that breaks its format (bad magic, sizes, lengths, not a regular
 * file); CT_EVERSION for a version this code does not read; CT_ERANGE for a
 * token id at or above the vocabulary; CT_ESHAPE for a model whose sizes
 * differ from a checkpoint's; CT_ENOMEM.
 *
 * Ownership. Tensors returned here follow ct's rule: inside a scope the scope
 * owns them, outside one the caller does. Every object here is a heap object
 * freed by its _free function, which accepts NULL. A loader borrows its
 * token set, which must outlive it.
 *
 * Threads. A ct_llmc_tokens is read-only once opened (and after
 * ct_llmc_tokens_set_vocab): any number of threads may read windows from it
 * at once. A loader is used by one thread at a time. A tokenizer is read-only
 * and thread-safe. The model functions are thread-safe on distinct models.
 */
#ifndef CT_LLMC_H
#define CT_LLMC_H

#include <ct/nn.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------ token shards */

/* The shard header: 256 int32, header[0] = magic, header[1] = version,
 * header[2] = the number of tokens; then that many uint16 tokens. */
#define CT_LLMC_TOKENS_MAGIC   20240520
#define CT_LLMC_TOKENS_VERSION 1

/* One or more shards mapped read-only, in order, as one token sequence. */
typedef struct ct_llmc_tokens ct_llmc_tokens;

/* Opens every file that the glob(3) pattern matches, in glob's (sorted)
 * order: llm.c's "dev/data/fineweb10B/fineweb_train_*.bin", or a single
 * path (a pattern without wildcards matches just that file, if it exists).
 * Each shard is checked whole (magic, version, a token count > 0 that
 * matches the file's length exactly) and mapped; tokens are not read until
 * used. The files must not change while the set is open: the mapping would
 * show the change, or fault on a file cut short. Returns a new set (free
 * with ct_llmc_tokens_free) or NULL: CT_EINVAL for a NULL or empty
 * pattern, or one that matches nothing (the message says so); CT_EIO,
 * CT_ECORRUPT, CT_EVERSION for a shard that cannot be used (the message
 * names it); CT_ENOMEM. Thread-safe. */
CT_API ct_llmc_tokens *ct_llmc_tokens_open(const char *pattern);
/* The same over n >= 1 explicit paths, in the order given (a path may
 * repeat). */
CT_API ct_llmc_tokens *ct_llmc_tokens_open_paths(const char *const *paths, int n);
/* Unmaps the shards and frees the set; accepts NULL. Loaders over it must
 * be freed first. */
CT_API void ct_llmc_tokens_free(ct_llmc_tokens *ts);

/* Tokens in all shards together; -1 with CT_EINVAL for NULL. */
CT_API int64_t ct_llmc_tokens_count(const ct_llmc_tokens *ts);
/* Shards in the set; -1 with CT_EINVAL for NULL. */
CT_API int ct_llmc_tokens_num_shards(const ct_llmc_tokens *ts);
/* Shard i's path as opened (borrowed, valid while ts lives), its token
 * count, its first token's offset in the flat sequence, and its tokens
 * (borrowed, read-only: the mapping itself, valid while ts lives). NULL or
 * -1 with CT_EINVAL for NULL ts, CT_ERANGE for i outside [0, shards). */
CT_API const char *ct_llmc_tokens_shard_path(const ct_llmc_tokens *ts, int i);
CT_API int64_t ct_llmc_tokens_shard_count(const ct_llmc_tokens *ts, int i);
CT_API int64_t ct_llmc_tokens_shard_start(const ct_llmc_tokens *ts, int i);
CT_API const uint16_t *ct_llmc_tokens_shard_data(const ct_llmc_tokens *ts, int i);

/* Makes every later read from ts (ct_llmc_tokens_read, _windows, a
 * loader's batches) fail with CT_ERANGE, naming the file and position, on a
 * token >= vocab, so that a shard tokenized for a larger vocabulary is an
 * error, not an out-of-range embedding lookup. The check costs one compare
 * per token read. vocab in [1, 65536]; 65536 (the default) checks
 * nothing. Errors: CT_EINVAL for NULL ts or vocab outside the range. Not
 * thread-safe: set it before sharing ts. */
CT_API int ct_llmc_tokens_set_vocab(ct_llmc_tokens *ts, int64_t vocab);
/* Reads every token (all shards: a full pass over the data) and writes the
 * largest id to *max_id, and where it first occurs to *shard and *index
 * (either may be NULL). Errors: CT_EINVAL for NULL ts or max_id.
 * Thread-safe. */
CT_API int ct_llmc_tokens_max_id(const ct_llmc_tokens *ts, int *max_id, int *shard, int64_t *index);
/* Reads every token and fails with CT_ERANGE, naming the file, the index in
 * it and the value, at the first token >= vocab. Does not change ts (see
 * ct_llmc_tokens_set_vocab for the per-read check). Errors: CT_EINVAL for
 * NULL ts or vocab < 1. Thread-safe. */
CT_API int ct_llmc_tokens_check_vocab(const ct_llmc_tokens *ts, int64_t vocab);

/* Copies n tokens from offset start of the flat sequence into dst (caller
 * storage, n int64), crossing shard boundaries as needed. Errors: CT_EINVAL
 * for NULL arguments or n < 0; CT_ERANGE for [start, start + n) outside
 * [0, count] or a token >= the vocab set. Thread-safe. */
CT_API int ct_llmc_tokens_read(const ct_llmc_tokens *ts, int64_t start, int64_t n, int64_t *dst);
/* Language-model windows: for each row r, x[r] = tokens [starts[r],
 * starts[r] + T) of the flat sequence and y[r] = the next tokens
 * [starts[r] + 1, starts[r] + T + 1), so each start must lie in
 * [0, count - T - 1]. A window may cross a shard boundary: the shards are
 * read as the one stream llm.c's scripts cut them from (fineweb cuts
 * documents across shards; every document starts with <|endoftext|>).
 * On success *x and *y are new int64 [rows, T] CPU tensors, owned like op
 * results; on failure both are NULL. Errors: CT_EINVAL for NULL arguments,
 * rows < 1 or T < 1; CT_ERANGE for a start outside its range (the message
 * names the row) or a token >= the vocab set; CT_ENOMEM. Thread-safe. */
CT_API int ct_llmc_tokens_windows(const ct_llmc_tokens *ts, const int64_t *starts, int64_t rows,
                                  int64_t T, ct_tensor **x, ct_tensor **y);

/* ------------------------------------------------------- streaming loader */

typedef struct ct_llmc_loader_options {
    int64_t batch;   /* B: rows per rank per batch, >= 1 */
    int64_t context; /* T: tokens per row, >= 1 */
    int rank;        /* this rank, in [0, num_ranks) */
    int num_ranks;   /* ranks sharing the stream; 0 means 1 */
} ct_llmc_loader_options;

/* Where a loader is: the next batch it returns is batch `batch` of shard
 * `shard`, in pass `epoch` over the shards. batch may equal the shard's
 * batch count (the shard is used up; the next call moves on). Plain
 * integers, the same on every rank, for a checkpoint. */
typedef struct ct_llmc_position {
    int64_t epoch;
    int64_t shard;
    int64_t batch;
} ct_llmc_position;

/* llm.c's DataLoader (llmc/dataloader.h, without shuffling), in order.
 * Each shard is cut into global batches of num_ranks * B * T consecutive
 * tokens; shard s holds (count_s - 1) / (num_ranks * B * T) of them (the
 * tail that does not fill one is skipped, so a batch never crosses a shard
 * boundary and its last target is still in the shard). Rank r's part of
 * global batch k is the B * T + 1 tokens from k * num_ranks * B * T +
 * r * B * T: x is the first B * T as [B, T], y the last B * T (the next
 * tokens). After the last batch of a shard comes the first batch of the
 * next shard that holds one; after the last shard, epoch + 1 and the first
 * shard again: the stream never ends. */
typedef struct ct_llmc_loader ct_llmc_loader;

/* A loader over ts at position (0, 0, 0). ts is borrowed and must outlive
 * the loader. Errors (NULL): CT_EINVAL for NULL arguments, B or T < 1, a
 * negative num_ranks or a rank outside [0, num_ranks); CT_ERANGE when no
 * shard holds one global batch (num_ranks * B * T + 1 tokens; the message
 * names the largest shard); CT_ENOMEM. Shards too short for a batch are
 * skipped. Thread-safe (distinct loaders). */
CT_API ct_llmc_loader *ct_llmc_loader_new(const ct_llmc_tokens *ts,
                                          const ct_llmc_loader_options *opts);
/* Frees the loader; accepts NULL. */
CT_API void ct_llmc_loader_free(ct_llmc_loader *l);
/* This rank's next batch: *x, *y int64 [B, T] CPU tensors (owned like op
 * results), and the position moves past it. Returns 0, or a negative code
 * with *x and *y NULL and the position unchanged: CT_EINVAL for NULL
 * arguments; CT_ERANGE for a token >= the vocab set (the message names the
 * file and index); CT_ENOMEM. Not thread-safe. */
CT_API int ct_llmc_loader_next(ct_llmc_loader *l, ct_tensor **x, ct_tensor **y);
/* Global batches in shard i (0 for a shard too short), or -1 with
 * CT_EINVAL / CT_ERANGE. Thread-safe. */
CT_API int64_t ct_llmc_loader_shard_batches(const ct_llmc_loader *l, int i);
/* Writes the position (see ct_llmc_position). Errors: CT_EINVAL for NULL.
 * Not thread-safe against ct_llmc_loader_next. */
CT_API int ct_llmc_loader_position(const ct_llmc_loader *l, ct_llmc_position *pos);
/* Moves to pos, as ct_llmc_loader_position gave it (on any rank of a run
 * with the same shards, B, T and num_ranks): the batches that follow are
 * those that followed then. Errors: CT_EINVAL for NULL; CT_ERANGE for an
 * epoch < 0, a shard outside [0, shards), or a batch outside [0, the
 * shard's batches]. Not thread-safe. */
CT_API int ct_llmc_loader_set_position(ct_llmc_loader *l, const ct_llmc_position *pos);

/* -------------------------------------------------------- GPT-2 checkpoint */

/* The model header: 256 int32, header[0] = magic, header[1] = version,
 * then maxT, V, L, NH, C, Vp at header[2..7]; the parameters follow in
 * llm.c's order (docs/llmc.md), float32 (version 3) or bfloat16 (5). */
#define CT_LLMC_GPT_MAGIC    20240326
#define CT_LLMC_GPT_FLOAT32  3
#define CT_LLMC_GPT_BFLOAT16 5
/* The largest sizes a header may give; larger ones are refused as corrupt
 * before anything is sized from them. */
#define CT_LLMC_GPT_MAX_CONTEXT (1 << 20)
#define CT_LLMC_GPT_MAX_VOCAB   (1 << 24)
#define CT_LLMC_GPT_MAX_LAYERS  4096
#define CT_LLMC_GPT_MAX_WIDTH   (1 << 16)

/* What a checkpoint's header says beyond a ct_gpt_config. */
typedef struct ct_llmc_gpt_info {
    int version;          /* CT_LLMC_GPT_FLOAT32 or CT_LLMC_GPT_BFLOAT16 */
    int64_t padded_vocab; /* Vp >= vocab: rows of wte in the file */
    int64_t num_params;   /* elements after the header (with the padding rows) */
} ct_llmc_gpt_info;

/* Reads and checks the header of the checkpoint at path (and that the file
 * is exactly as long as it says) and fills *cfg: vocab = V, context = maxT,
 * layers = L, heads = NH, width = C, dropout 0, checkpoint false; and *info
 * when not NULL. Errors: CT_EINVAL for NULL path or cfg; CT_EIO;
 * CT_ECORRUPT for a bad magic (the message says which llm.c file the magic
 * belongs to, if any), sizes <= 0 or above the CT_LLMC_GPT_MAX_* limits, a
 * width not divisible by the heads, Vp < V, or a length that differs from
 * the header's; CT_EVERSION for a version other than 3 or 5. Thread-safe. */
CT_API int ct_llmc_gpt_read_config(const char *path, ct_gpt_config *cfg, ct_llmc_gpt_info *info);
/* Copies the checkpoint's parameters into gpt, a model ct_gpt_new() made
 * (on any device, any float dtype), whose sizes must equal the file's: the
 * padding rows Vp - V of wte are dropped, bfloat16 values widen exactly.
 * The whole file is read and checked before gpt changes, so on an error
 * gpt is as it was. Grad mode is off during the copy. Errors: those of
 * ct_llmc_gpt_read_config; CT_EINVAL for a NULL gpt or one that is not a
 * GPT; CT_ESHAPE when its sizes differ from the file's (the message gives
 * both); CT_ENOMEM. Not thread-safe against other users of gpt. */
CT_API int ct_llmc_gpt_load_into(ct_module *gpt, const char *path);
/* A new ct_gpt with the checkpoint's sizes and parameters (caller-owned;
 * ct_module_free). dropout and checkpoint come from opts (NULL: 0 and
 * false); its size fields are ignored. Errors: those of load_into, NULL
 * returned. */
CT_API ct_module *ct_llmc_gpt_load(const char *path, const ct_gpt_config *opts);
/* Writes gpt (a model ct_gpt_new() made) to path as llm.c's version 3
 * (float32), with V padded to Vp = V rounded up to a multiple of 128 by
 * zero rows, as llm.c's train_gpt2.py does. The file is written to a
 * temporary name in path's directory, synced and renamed over path, so a
 * crash leaves the old file or the new one. Errors: CT_EINVAL for NULL
 * arguments or a module that is not a GPT; CT_EIO; CT_ENOMEM. Thread-safe
 * on distinct paths, while nothing changes gpt. */
CT_API int ct_llmc_gpt_save(const ct_module *gpt, const char *path);
/* The same in a chosen version: CT_LLMC_GPT_FLOAT32 or CT_LLMC_GPT_BFLOAT16
 * (float32 rounded to nearest even). CT_EVERSION for another. */
CT_API int ct_llmc_gpt_save_as(const ct_module *gpt, const char *path, int version);

/* --------------------------------------------------------------- tokenizer */

/* gpt2_tokenizer.bin: 256 uint32, header[0] = magic, header[1] = version
 * (1, or 2 with the <|endoftext|> id at header[3]), header[2] = vocab; then
 * for each token a uint8 length >= 1 and that many bytes. */
#define CT_LLMC_TOKENIZER_MAGIC 20240328

typedef struct ct_llmc_tokenizer ct_llmc_tokenizer;

/* Reads and checks the whole file: magic, version, a vocab in [1, 2^24]
 * (version 1: exactly 50257, GPT-2's, whose <|endoftext|> is 50256, as
 * llm.c assumes), an eot id below the vocab, every length >= 1, nothing
 * after the last token. Returns a new tokenizer (ct_llmc_tokenizer_free) or
 * NULL: CT_EINVAL for NULL path; CT_EIO; CT_ECORRUPT; CT_EVERSION;
 * CT_ENOMEM. Thread-safe. */
CT_API ct_llmc_tokenizer *ct_llmc_tokenizer_load(const char *path);
CT_API void ct_llmc_tokenizer_free(ct_llmc_tokenizer *tok);
/* The vocabulary size, or -1 with CT_EINVAL for NULL. */
CT_API int64_t ct_llmc_tokenizer_vocab(const ct_llmc_tokenizer *tok);
/* The <|endoftext|> id, or -1 with CT_EINVAL for NULL. */
CT_API int64_t ct_llmc_tokenizer_eot(const ct_llmc_tokenizer *tok);
/* Token id's bytes (borrowed, valid while tok lives; NUL-terminated for
 * printing, but a token may hold a zero byte: *len, when not NULL, is the
 * true length). Byte-level BPE tokens are pieces of UTF-8, not always whole
 * characters. NULL with CT_EINVAL for NULL tok, CT_ERANGE for an id outside
 * [0, vocab). Thread-safe. */
CT_API const char *ct_llmc_tokenizer_decode(const ct_llmc_tokenizer *tok, int64_t id, size_t *len);

#ifdef __cplusplus
}
#endif

#endif /* CT_LLMC_H */
