/* Counts the frames FFmpeg's decoders hand out, for benchmarks/video_decode.py's peer readers.
 *
 * Loaded with LD_PRELOAD into the peer's python (never into vlforge's), it wraps avcodec_receive_frame
 * (and the older avcodec_decode_video2) and counts each call that returns a frame. The real function is
 * looked up from the caller's own library: its dependencies hold the libavcodec it was linked against,
 * which may be one the reader opened RTLD_LOCAL (torchcodec) or one a wheel bundles under another file name
 * (decord, PyAV), and two different libavcodec versions can be loaded in one process. Python reads the
 * count with ctypes: vlforge_frames_decoded(), vlforge_frames_reset().
 *
 * Build: cc -shared -fPIC -O2 -o libcount_frames.so count_frames.c -ldl -lpthread
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

static atomic_long decoded;
static _Thread_local int in_legacy; /* avcodec_decode_video2 may call avcodec_receive_frame itself */

#define SLOTS 16
struct slot { void *caller_base; const char *symbol; void *real; };
static struct slot cache[SLOTS];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* The definition of `symbol` that the library containing `caller` resolves to (never this shim's). */
static void *real_for(const void *caller, const char *symbol) {
    Dl_info info;
    if (!dladdr(caller, &info) || !info.dli_fbase) return NULL;
    void *found = NULL;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < SLOTS; i++)
        if (cache[i].caller_base == info.dli_fbase && cache[i].symbol == symbol) { found = cache[i].real; break; }
    if (!found) {
        void *handle = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
        if (handle) {
            found = dlsym(handle, symbol); /* searches that library and its dependencies, not the preload */
            dlclose(handle);
        }
        for (int i = 0; found && i < SLOTS; i++)
            if (!cache[i].caller_base) { cache[i] = (struct slot){info.dli_fbase, symbol, found}; break; }
    }
    pthread_mutex_unlock(&lock);
    return found;
}

int avcodec_receive_frame(void *context, void *frame) {
    int (*next)(void *, void *) = (int (*)(void *, void *))real_for(__builtin_return_address(0),
                                                                     "avcodec_receive_frame");
    if (!next) return -22; /* AVERROR(EINVAL): the caller links no libavcodec */
    int rc = next(context, frame);
    if (rc == 0 && !in_legacy) atomic_fetch_add(&decoded, 1);
    return rc;
}

int avcodec_decode_video2(void *context, void *frame, int *got_picture, const void *packet) {
    int (*next)(void *, void *, int *, const void *) = (int (*)(void *, void *, int *, const void *))real_for(
        __builtin_return_address(0), "avcodec_decode_video2");
    if (!next) return -22;
    in_legacy = 1;
    int rc = next(context, frame, got_picture, packet);
    in_legacy = 0;
    if (rc >= 0 && got_picture && *got_picture) atomic_fetch_add(&decoded, 1);
    return rc;
}

long vlforge_frames_decoded(void) { return atomic_load(&decoded); }

void vlforge_frames_reset(void) { atomic_store(&decoded, 0); }
