// kernel 2 of the tiny package: a real kernel, so each object holds an sm_XY cubin
extern "C" __global__ void scale2(float *x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * a + 2.0f;
}

extern "C" int launch2(float *x, float a, int n) {
    scale2<<<(n + 255) / 256, 256>>>(x, a, n);
    return 0;
}
