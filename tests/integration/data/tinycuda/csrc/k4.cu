// kernel 4 of the tiny package: a real kernel, so each object holds an sm_XY cubin
extern "C" __global__ void scale4(float *x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * a + 4.0f;
}

extern "C" int launch4(float *x, float a, int n) {
    scale4<<<(n + 255) / 256, 256>>>(x, a, n);
    return 0;
}
