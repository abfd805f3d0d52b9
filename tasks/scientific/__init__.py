"""Scientific computing on distributed grids (FFTW-MPI, heFFTe, cuFFTMp, MPI stencil codes):
transposes by all-to-all and halo exchanges between neighbouring slabs."""
