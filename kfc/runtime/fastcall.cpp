/* kfc's launch fast path as a CPython extension over ATen (built once per machine and torch
 * version by kfc.runtime.fastcall).
 *
 * A Launcher holds one call signature of one kernel: for each positional argument what it must
 * be (a tensor of this dtype, shape and device, optional or not; a scalar of this C type), the
 * outputs to make (or check, when given by out=), the grid, block and cluster, and the argument values the
 * signature fixes (dims, defaulted scalars). Calling it with a call's arguments checks them,
 * allocates the outputs and calls cuLaunchKernelEx; an argument it does not recognise makes it
 * return the `miss` object instead, and kfc's full path then says what is wrong.
 *
 * The argument array and the launch config live on the C stack, so concurrent calls from
 * several threads share nothing but read-only state. Tensors are read through ATen (a field
 * read, not a Python call) and outputs made with at::empty. libcuda is not linked: the
 * driver's entry points come in as addresses from the ctypes handle kfc already holds, and the
 * stream from torch's accessor, so no CUDA header is needed to build this (it builds against
 * a CPU-only torch too). The CUDA structures are declared here as cuda.h lays them out
 * (tests/test_fastcall.py compiles this file against cuda.h with KFC_CHECK_CUDA_H to prove it).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

typedef struct {
    int id;
    char pad[4];
    union { char bytes[64]; unsigned cluster[3]; void *align; } value;
} LaunchAttribute;

typedef struct {
    unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    void *hStream;
    LaunchAttribute *attrs;
    unsigned numAttrs;
} LaunchConfig;

#ifdef KFC_CHECK_CUDA_H
#include <cuda.h>
static_assert(sizeof(LaunchConfig) == sizeof(CUlaunchConfig), "CUlaunchConfig size");
static_assert(offsetof(LaunchConfig, hStream) == offsetof(CUlaunchConfig, hStream), "hStream");
static_assert(offsetof(LaunchConfig, attrs) == offsetof(CUlaunchConfig, attrs), "attrs");
static_assert(offsetof(LaunchConfig, numAttrs) == offsetof(CUlaunchConfig, numAttrs), "numAttrs");
static_assert(sizeof(LaunchAttribute) == sizeof(CUlaunchAttribute), "CUlaunchAttribute size");
static_assert(offsetof(LaunchAttribute, value) == offsetof(CUlaunchAttribute, value), "value");
static_assert(CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION == 4, "cluster attribute id");
static_assert(CUDA_ERROR_INVALID_CONTEXT == 201, "invalid context");
#else  /* the extension */
#include <ATen/ATen.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>


#define CLUSTER_DIMENSION 4
#define INVALID_CONTEXT 201
#define MAX_SLOTS 64

typedef int (*LaunchFn)(const LaunchConfig *, void *, void **, void **);
typedef int (*CtxSetFn)(void *);

/* Slot kinds: how a value is stored in its 8-byte argument cell (kfc.runtime.fastcall.KINDS). */
enum { K_PTR = 0, K_I8 = 1, K_BOOL = 2, K_I32 = 3, K_I64 = 4, K_F32 = 5, K_F64 = 6 };

struct TensorSpec {
    Py_ssize_t arg = 0;  /* positional index (for outputs given by out=: index into out) */
    int slot = 0;
    bool none = false;   /* the signature passed None here */
    at::ScalarType dtype = at::ScalarType::Undefined;
    std::vector<int64_t> shape;
    at::Device device = at::Device(at::kCPU);
};

struct ScalarSpec { Py_ssize_t arg; int slot; int kind; };

struct Launcher {
    PyObject_HEAD
    LaunchFn launch;
    CtxSetFn ctx_set;
    void *context, *function;
    LaunchConfig config;
    LaunchAttribute attr;
    bool runs;
    Py_ssize_t nargs;
    int nslots;
    unsigned char kinds[MAX_SLOTS];
    uint64_t cells[MAX_SLOTS];  /* the values the signature fixes; a call copies and fills the rest */
    std::vector<TensorSpec> *tensors, *outputs;  /* outputs: what to make, or what out= must be */
    std::vector<ScalarSpec> *scalars;
    bool outputs_given;  /* the signature passed out=: outputs are checked, not made */
    PyObject *stream_of, *device_obj, *on_error, *miss, *name;
};

static void set_cell(uint64_t *cell, int kind, long long i, double f) {
    switch (kind) {
    case K_I8: { int8_t v = (int8_t)i; memcpy(cell, &v, sizeof v); break; }
    case K_BOOL: { unsigned char v = i != 0; memcpy(cell, &v, sizeof v); break; }
    case K_I32: { int32_t v = (int32_t)i; memcpy(cell, &v, sizeof v); break; }
    case K_F32: { float v = (float)f; memcpy(cell, &v, sizeof v); break; }
    case K_F64: memcpy(cell, &f, sizeof f); break;
    default: { int64_t v = (int64_t)i; memcpy(cell, &v, sizeof v); break; }
    }
}

/* Whether `obj` is a contiguous, 16-byte aligned tensor as `spec` says (its address in *ptr).
 * Anything this cannot read (a subclass without storage, a fake tensor) is a mismatch: the
 * full path then says what is wrong. */
static bool match_tensor(PyObject *obj, const TensorSpec &spec, uint64_t *ptr) {
    if (obj == Py_None) { *ptr = 0; return spec.none; }
    if (spec.none || !THPVariable_Check(obj)) return false;
    try {
        const at::Tensor &t = THPVariable_Unpack(obj);
        if (!t.defined() || t.scalar_type() != spec.dtype || t.device() != spec.device) return false;
        if (t.sizes() != at::IntArrayRef(spec.shape) || !t.is_contiguous()) return false;
        *ptr = (uint64_t)(uintptr_t)t.data_ptr();
        return (*ptr & 15) == 0;
    } catch (const std::exception &) {
        return false;
    }
}

static PyObject *miss(Launcher *self) { Py_INCREF(self->miss); return self->miss; }

static PyObject *launcher_run(Launcher *self, PyObject *args, PyObject *out) {
    if (!PyTuple_CheckExact(args) || PyTuple_GET_SIZE(args) != self->nargs) return miss(self);
    PyObject *const *items = &PyTuple_GET_ITEM(args, 0);
    uint64_t cells[MAX_SLOTS];
    memcpy(cells, self->cells, sizeof(uint64_t) * self->nslots);
    for (const TensorSpec &spec : *self->tensors)
        if (!match_tensor(items[spec.arg], spec, &cells[spec.slot])) return miss(self);
    for (const ScalarSpec &spec : *self->scalars) {
        PyObject *v = items[spec.arg];
        if (spec.kind == K_F32 || spec.kind == K_F64) {
            if (!PyFloat_Check(v) && !PyLong_Check(v)) return miss(self);
            double f = PyFloat_AsDouble(v);
            if (f == -1.0 && PyErr_Occurred()) { PyErr_Clear(); return miss(self); }
            set_cell(&cells[spec.slot], spec.kind, 0, f);
        } else {
            if (!PyLong_Check(v)) return miss(self);
            int overflow = 0;
            long long i = PyLong_AsLongLongAndOverflow(v, &overflow);
            if (overflow || (i == -1 && PyErr_Occurred())) { PyErr_Clear(); return miss(self); }
            if ((spec.kind == K_I32 && (i < INT32_MIN || i > INT32_MAX)) ||
                (spec.kind == K_I8 && (i < INT8_MIN || i > INT8_MAX))) return miss(self);
            set_cell(&cells[spec.slot], spec.kind, i, 0.0);
        }
    }
    const std::vector<TensorSpec> &outputs = *self->outputs;
    Py_ssize_t n = (Py_ssize_t)outputs.size();
    PyObject *result = PyTuple_New(n);
    if (!result) return NULL;
    if (self->outputs_given) {
        PyObject *const *given;
        Py_ssize_t ngiven;
        if (PyTuple_Check(out)) { given = &PyTuple_GET_ITEM(out, 0); ngiven = PyTuple_GET_SIZE(out); }
        else if (PyList_Check(out)) { given = &PyList_GET_ITEM(out, 0); ngiven = PyList_GET_SIZE(out); }
        else { given = &out; ngiven = 1; }
        bool ok = ngiven == n;
        for (Py_ssize_t k = 0; ok && k < n; k++)
            ok = given[k] != Py_None && match_tensor(given[k], outputs[k], &cells[outputs[k].slot]);
        if (!ok) { Py_DECREF(result); return miss(self); }
        for (Py_ssize_t k = 0; k < n; k++) { Py_INCREF(given[k]); PyTuple_SET_ITEM(result, k, given[k]); }
    } else {
        if (out != Py_None) { Py_DECREF(result); return miss(self); }
        try {
            for (Py_ssize_t k = 0; k < n; k++) {
                at::Tensor t = at::empty(outputs[k].shape, at::TensorOptions().dtype(outputs[k].dtype)
                                                                .device(outputs[k].device));
                cells[outputs[k].slot] = (uint64_t)(uintptr_t)t.data_ptr();
                PyObject *wrapped = THPVariable_Wrap(std::move(t));
                if (!wrapped) { Py_DECREF(result); return NULL; }
                PyTuple_SET_ITEM(result, k, wrapped);
            }
        } catch (const std::exception &e) {  /* out of memory, most likely */
            Py_DECREF(result);
            PyErr_Format(PyExc_RuntimeError, "allocating the outputs of %U: %s", self->name, e.what());
            return NULL;
        }
    }
    if (self->runs) {
        PyObject *stream = PyObject_Vectorcall(self->stream_of, &self->device_obj, 1, NULL);
        if (!stream) { Py_DECREF(result); return NULL; }
        LaunchConfig config = self->config;
        config.hStream = PyLong_AsVoidPtr(stream);
        Py_DECREF(stream);
        if (PyErr_Occurred()) { Py_DECREF(result); return NULL; }
        if (config.numAttrs) config.attrs = &self->attr;
        void *params[MAX_SLOTS];
        for (int k = 0; k < self->nslots; k++) params[k] = &cells[k];
        int err = self->launch(&config, self->function, params, NULL);
        if (err == INVALID_CONTEXT) {  /* a thread where torch has not made its context current */
            err = self->ctx_set(self->context);
            if (!err) err = self->launch(&config, self->function, params, NULL);
        }
        if (err) {
            PyObject *r = PyObject_CallFunction(self->on_error, "i", err);
            Py_XDECREF(r);
            if (!PyErr_Occurred()) PyErr_Format(PyExc_RuntimeError, "CUDA error %d launching %U", err, self->name);
            Py_DECREF(result);
            return NULL;
        }
    }
    if (n == 1) {
        PyObject *only = PyTuple_GET_ITEM(result, 0);
        Py_INCREF(only);
        Py_DECREF(result);
        return only;
    }
    return result;
}

static bool initialised(Launcher *self) {
    if (self->tensors) return true;
    PyErr_SetString(PyExc_RuntimeError, "this Launcher was never initialised");
    return false;
}

static PyObject *launcher_call(Launcher *self, PyObject *args, PyObject *kwargs) {
    PyObject *call_args, *out = Py_None;
    static const char *names[] = {"args", "out", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O", (char **)names, &call_args, &out)) return NULL;
    if (!initialised(self)) return NULL;
    return launcher_run(self, call_args, out);
}

static at::Device device_of(long index) {
    return index < 0 ? at::Device(at::kCPU) : at::Device(at::kCUDA, (at::DeviceIndex)index);
}

/* A tensor spec from (arg, slot, dtype | None, shape, device index, -1 for the CPU). */
static int parse_tensor(PyObject *item, TensorSpec &spec, int nslots, Py_ssize_t nargs) {
    PyObject *dtype, *shape;
    long device;
    if (!PyArg_ParseTuple(item, "niOOl", &spec.arg, &spec.slot, &dtype, &shape, &device)) return -1;
    if (spec.slot < 0 || spec.slot >= nslots || spec.arg < 0 || spec.arg >= nargs) {
        PyErr_SetString(PyExc_ValueError, "tensor slot or argument out of range");
        return -1;
    }
    spec.none = dtype == Py_None;
    if (!spec.none) {
        if (!THPDtype_Check(dtype)) { PyErr_SetString(PyExc_TypeError, "dtype must be a torch.dtype or None"); return -1; }
        spec.dtype = ((THPDtype *)dtype)->scalar_type;
    }
    PyObject *seq = PySequence_Fast(shape, "shape must be a sequence of ints");
    if (!seq) return -1;
    for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(seq); k++) {
        long long d = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, k));
        if (d == -1 && PyErr_Occurred()) { Py_DECREF(seq); return -1; }
        spec.shape.push_back(d);
    }
    Py_DECREF(seq);
    spec.device = device_of(device);
    return 0;
}

static int parse_tensors(PyObject *list, std::vector<TensorSpec> &specs, int nslots, Py_ssize_t nargs) {
    if (!PyList_Check(list)) { PyErr_SetString(PyExc_TypeError, "tensor specs must be a list"); return -1; }
    specs.resize(PyList_GET_SIZE(list));
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(list); k++)
        if (parse_tensor(PyList_GET_ITEM(list, k), specs[k], nslots, nargs)) return -1;
    return 0;
}

static int launcher_init(Launcher *self, PyObject *args, PyObject *kwargs) {
    static const char *names[] = {"launch", "ctx_set", "context", "function", "grid", "block", "cluster", "smem",
                                  "kinds", "fixed", "nargs", "tensors", "scalars", "outputs", "outputs_given",
                                  "stream_of", "device", "on_error", "miss", "name", NULL};
    unsigned long long launch, ctx_set, context, function;
    unsigned gx, gy, gz, bx, by, bz, cluster, smem;
    PyObject *kinds, *fixed, *tensors, *scalars, *outputs, *stream_of, *on_error, *miss_obj, *name;
    int outputs_given;
    long device;
    Py_ssize_t nargs;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "KKKK(III)(III)IIOOnOOOpOlOOU", (char **)names, &launch,
                                     &ctx_set, &context, &function, &gx, &gy, &gz, &bx, &by, &bz, &cluster, &smem,
                                     &kinds, &fixed, &nargs, &tensors, &scalars, &outputs, &outputs_given,
                                     &stream_of, &device, &on_error, &miss_obj, &name))
        return -1;
    if (self->tensors) { PyErr_SetString(PyExc_RuntimeError, "a Launcher is initialised once"); return -1; }
    self->nargs = nargs;
    self->tensors = new std::vector<TensorSpec>();
    self->outputs = new std::vector<TensorSpec>();
    self->scalars = new std::vector<ScalarSpec>();
    Py_INCREF(stream_of); self->stream_of = stream_of;
    Py_INCREF(on_error); self->on_error = on_error;
    Py_INCREF(miss_obj); self->miss = miss_obj;
    Py_INCREF(name); self->name = name;
    self->device_obj = PyLong_FromLong(device);
    self->launch = (LaunchFn)(uintptr_t)launch;
    self->ctx_set = (CtxSetFn)(uintptr_t)ctx_set;
    self->context = (void *)(uintptr_t)context;
    self->function = (void *)(uintptr_t)function;
    self->runs = gx > 0 && gy > 0 && gz > 0;
    self->outputs_given = outputs_given != 0;
    memset(&self->config, 0, sizeof self->config);
    self->config.gridDimX = gx; self->config.gridDimY = gy; self->config.gridDimZ = gz;
    self->config.blockDimX = bx; self->config.blockDimY = by; self->config.blockDimZ = bz;
    self->config.sharedMemBytes = smem;
    memset(&self->attr, 0, sizeof self->attr);
    if (cluster > 1) {
        self->attr.id = CLUSTER_DIMENSION;
        self->attr.value.cluster[0] = cluster; self->attr.value.cluster[1] = 1; self->attr.value.cluster[2] = 1;
        self->config.numAttrs = 1;
    }
    if (!PyBytes_Check(kinds) || PyBytes_GET_SIZE(kinds) > MAX_SLOTS) {
        PyErr_SetString(PyExc_ValueError, "kinds must be bytes, one per slot (at most 64)");
        return -1;
    }
    self->nslots = (int)PyBytes_GET_SIZE(kinds);
    memcpy(self->kinds, PyBytes_AS_STRING(kinds), self->nslots);
    memset(self->cells, 0, sizeof self->cells);
    if (!PyDict_Check(fixed)) { PyErr_SetString(PyExc_TypeError, "fixed must be a dict of slot -> value"); return -1; }
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(fixed, &pos, &key, &value)) {
        long k = PyLong_AsLong(key);
        if (k < 0 || k >= self->nslots) { PyErr_SetString(PyExc_ValueError, "fixed slot out of range"); return -1; }
        int kind = self->kinds[k];
        if (kind == K_F32 || kind == K_F64) set_cell(&self->cells[k], kind, 0, PyFloat_AsDouble(value));
        else set_cell(&self->cells[k], kind, PyLong_AsLongLong(value), 0.0);
        if (PyErr_Occurred()) return -1;
    }
    if (parse_tensors(tensors, *self->tensors, self->nslots, self->nargs)) return -1;
    if (parse_tensors(outputs, *self->outputs, self->nslots, PY_SSIZE_T_MAX)) return -1;
    for (const TensorSpec &o : *self->outputs)
        if (o.none) { PyErr_SetString(PyExc_ValueError, "an output must have a dtype"); return -1; }
    if (!PyList_Check(scalars)) { PyErr_SetString(PyExc_TypeError, "scalars must be a list"); return -1; }
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(scalars); k++) {
        ScalarSpec s;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(scalars, k), "ni", &s.arg, &s.slot)) return -1;
        if (s.arg < 0 || s.arg >= self->nargs || s.slot < 0 || s.slot >= self->nslots) {
            PyErr_SetString(PyExc_ValueError, "scalar slot or argument out of range");
            return -1;
        }
        s.kind = self->kinds[s.slot];
        self->scalars->push_back(s);
    }
    return 0;
}

static void launcher_dealloc(Launcher *self) {
    delete self->tensors;
    delete self->outputs;
    delete self->scalars;
    Py_XDECREF(self->stream_of); Py_XDECREF(self->device_obj); Py_XDECREF(self->on_error);
    Py_XDECREF(self->miss); Py_XDECREF(self->name);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject LauncherType = {PyVarObject_HEAD_INIT(NULL, 0)};

/* dispatch(launchers, args, out, miss): the first launcher that takes the call, or miss. */
static PyObject *dispatch(PyObject *, PyObject *const *argv, Py_ssize_t argc) {
    if (argc != 4 || !PyList_Check(argv[0])) {
        PyErr_SetString(PyExc_TypeError, "dispatch(launchers: list, args: tuple, out, miss)");
        return NULL;
    }
    PyObject *launchers = argv[0];
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(launchers); k++) {
        PyObject *l = PyList_GET_ITEM(launchers, k);
        if (Py_TYPE(l) != &LauncherType) continue;
        if (!initialised((Launcher *)l)) return NULL;
        /* the call may run Python (the stream accessor, on_error), and another thread may
           drop this launcher from the list meanwhile: hold it */
        Py_INCREF(l);
        PyObject *r = launcher_run((Launcher *)l, argv[1], argv[2]);
        bool missed = r == ((Launcher *)l)->miss;
        Py_DECREF(l);
        if (!missed) return r;
        Py_DECREF(r);
    }
    Py_INCREF(argv[3]);
    return argv[3];
}

static PyMethodDef methods[] = {
    {"dispatch", (PyCFunction)(void (*)(void))dispatch, METH_FASTCALL, "dispatch(launchers, args, out, miss)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "kfc_fastcall", NULL, -1, methods};

PyMODINIT_FUNC PyInit_kfc_fastcall(void) {
    LauncherType.tp_name = "kfc_fastcall.Launcher";
    LauncherType.tp_basicsize = sizeof(Launcher);
    LauncherType.tp_flags = Py_TPFLAGS_DEFAULT;
    LauncherType.tp_doc = "One call signature of one kernel: Launcher(...)(args, out) launches it or returns miss.";
    LauncherType.tp_new = PyType_GenericNew;
    LauncherType.tp_init = (initproc)launcher_init;
    LauncherType.tp_dealloc = (destructor)launcher_dealloc;
    LauncherType.tp_call = (ternaryfunc)launcher_call;
    if (PyType_Ready(&LauncherType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&LauncherType);
    if (PyModule_AddObject(m, "Launcher", (PyObject *)&LauncherType) < 0) return NULL;
    return m;
}
#endif  /* KFC_CHECK_CUDA_H */
