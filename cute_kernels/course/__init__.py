"""The course's figures and tables (docs/course/), made by the project's own code.

A page marks each generated piece with

    <!-- BEGIN GENERATED: course NAME -->
    ...replaced...
    <!-- END GENERATED -->

and the `Figure` registered under NAME makes its Markdown (a table, an image link, a SASS
listing) and writes its images under docs/course/img/. Figures need one of three things:

- `cpu`: pure Python (layouts, analyses, the committed benchmark JSONs in docs/results/);
- `compile`: the CuTe DSL, building kernels for sm_90a without a GPU (SASS, registers);
- `gpu`: measurements on a Hopper GPU. Their `measure()` runs there (`--gpu`) and its numbers
  are stored in docs/course/data/gpu-<device>.json; `make()` renders from that file, so the
  tables and plots can be redrawn anywhere. Until the file has them, the block says so and
  shows no number.

Modules: `core` (the registry, the page blocks, the render context), `draw` (number formats,
small PNGs), `figures_cpu` (layouts, analyses, results: `cpu` figures), `figures_sass`
(`compile` figures), `measure` (GPU helpers: timing, correctness checks), `figures_gpu` (the
probes' `gpu` figures) and `figures_gpu_ops` (those of the library's ops), `__main__` (the
command line: `python scripts/course_figures.py --cpu | --gpu`). This package sits at the top
layer, beside `bench` and `cli`.
"""
