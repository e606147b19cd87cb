"""Triton's CPU interpreter, without its repeated patching of triton.language.

Every call of a nested @triton.jit function re-patches the whole of triton.language for the
interpreter (inspect.getmembers over four modules), although the kernel launch around it has
patched it already and restores it when the launch ends. Under the interpreter our kernels
call helpers inside their loops, and that patching took ~25% of a kernel-path forward's time
(cProfile, triton 3.9.0). Here a launch patches once, and the calls inside it reuse its patches
where they see the same language modules (tl.sum's module also sees triton.language.core, so
its first call patches that too): the kernels run the same code. The suite runs kernels on one thread at a time (the interpreter's
patches are process-wide either way).
"""

from __future__ import annotations


class _Unpatched:
    def restore(self) -> None:
        pass


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
