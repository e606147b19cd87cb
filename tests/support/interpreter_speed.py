"""Triton's CPU interpreter, without its repeated patching of triton.language, and without
its integer overflow checks.

Every call of a nested @triton.jit function re-patches the whole of triton.language for the
interpreter (inspect.getmembers over four modules), although the kernel launch around it has
patched it already and restores it when the launch ends. Under the interpreter our kernels
call helpers inside their loops, and that patching took ~25% of a kernel-path forward's time
(cProfile, triton 3.9.0). Here a launch patches once, and the calls inside it reuse its patches
where they see the same language modules (tl.sum's module also sees triton.language.core, so
its first call patches that too): the kernels run the same code. The suite runs kernels on one
thread at a time (the interpreter's patches are process-wide either way).

The interpreter also redoes every int32 add, subtract and multiply in int64 to assert that
it did not overflow: ~35% of a kernel-path forward's time (cProfile, the fast-path golden
test). The tests' tensors are small, so no index or address they compute comes near 2^31 and
the check cannot fire; overflow at release sizes (1M-token contexts) is what the GPU runs
exercise.
"""

from __future__ import annotations

import dataclasses


class _Unpatched:
    def restore(self) -> None:
        pass


def skip_overflow_checks() -> None:
    from triton.runtime import interpreter

    builder = getattr(interpreter, "interpreter_builder", None)
    if builder is not None and hasattr(builder.options, "sanitize_overflow"):
        builder.options = dataclasses.replace(builder.options, sanitize_overflow=False)


def patch_once_per_launch() -> None:
    import triton.language as tl
    from triton.runtime import interpreter

    patch = getattr(interpreter, "_patch_lang", None)
    if patch is None or getattr(patch, "once_per_launch", False):
        return  # another triton, or done already
    patched: set[tuple[int, ...]] = set()  # the language modules patched in this launch, by function

    def patch_lang(fn):
        langs = tuple(sorted(id(v) for v in fn.__globals__.values() if v is tl or v is tl.core))
        if patched and langs in patched:  # inside a launch that patched these modules already
            return _Unpatched()
        launch = not patched
        scope = patch(fn)
        patched.add(langs)
        if launch:  # the launch restores the language when it ends
            restore = scope.restore

            def restore_and_end():
                patched.clear()
                restore()

            scope.restore = restore_and_end
        return scope

    patch_lang.once_per_launch = True
    interpreter._patch_lang = patch_lang
