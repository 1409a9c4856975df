/* The reductions the helper runs itself (sum/prod of float32/float64, sum/prod/min/max
 * of the integer types), each element folded in rank order as numpy's fold is. */
#include "_symm.h"

/* ---- folds: out = b0 op b1 op ... in the order given --------------------------------- */
/* Vectorised (-O3) for the machine's widest unit where the compiler can dispatch at load
 * time (as numpy's loops do); each element is still one IEEE operation per rank, in order. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define WIDE __attribute__((target_clones("avx2", "default")))
#else
#define WIDE
#endif
#define FOLD(NAME, T, EXPR)                                                              \
    WIDE static void NAME(char *out_, char **blk, int nb, Py_ssize_t n) {                 \
        T *out = (T *)out_;                                                               \
        const T *x = (const T *)blk[0], *y = (const T *)blk[1];                           \
        for (Py_ssize_t i = 0; i < n; i++) { T a = x[i], c = y[i]; out[i] = (EXPR); }     \
        for (int k = 2; k < nb; k++) {                                                    \
            y = (const T *)blk[k];                                                        \
            for (Py_ssize_t i = 0; i < n; i++) { T a = out[i], c = y[i]; out[i] = (EXPR); } \
        }                                                                                 \
    }
/* Signed sums and products wrap as numpy's do: computed in the unsigned type. */
#define INTFOLDS(S, T, U)                                                                 \
    FOLD(sum_##S, T, (T)((U)a + (U)c))                                                    \
    FOLD(prod_##S, T, (T)((U)a * (U)c))                                                   \
    FOLD(min_##S, T, (a <= c ? a : c))                                                    \
    FOLD(max_##S, T, (a >= c ? a : c))
FOLD(sum_f32, float, a + c)
FOLD(prod_f32, float, a * c)
FOLD(sum_f64, double, a + c)
FOLD(prod_f64, double, a * c)
INTFOLDS(i8, int8_t, uint8_t)
INTFOLDS(i16, int16_t, uint16_t)
INTFOLDS(i32, int32_t, uint32_t)
INTFOLDS(i64, int64_t, uint64_t)
INTFOLDS(u8, uint8_t, uint8_t)
INTFOLDS(u16, uint16_t, uint16_t)
INTFOLDS(u32, uint32_t, uint32_t)
INTFOLDS(u64, uint64_t, uint64_t)

/* The fold for (dtype code, op code), NULL where numpy must do it (float min/max: numpy's
 * NaN and signed-zero rules). */
fold_fn fold_for(int t, int op, int *itemsize) {
#define INTS(C, S, SZ) case C: *itemsize = SZ; \
        return op == OP_SUM ? sum_##S : op == OP_PROD ? prod_##S : op == OP_MIN ? min_##S \
             : op == OP_MAX ? max_##S : NULL;
    switch (t) {
    case T_F32: *itemsize = 4; return op == OP_SUM ? sum_f32 : op == OP_PROD ? prod_f32 : NULL;
    case T_F64: *itemsize = 8; return op == OP_SUM ? sum_f64 : op == OP_PROD ? prod_f64 : NULL;
    INTS(T_I8, i8, 1) INTS(T_I16, i16, 2) INTS(T_I32, i32, 4) INTS(T_I64, i64, 8)
    INTS(T_U8, u8, 1) INTS(T_U16, u16, 2) INTS(T_U32, u32, 4) INTS(T_U64, u64, 8)
    }
#undef INTS
    return NULL;
}

PyObject *supports(PyObject *mod, PyObject *args) {
    int t, op, isz;
    if (!PyArg_ParseTuple(args, "ii", &t, &op)) return NULL;
    return PyBool_FromLong(fold_for(t, op, &isz) != NULL);
}
