"""vlforge's fast paths: explicit, logged, reversible patches keyed on what a module is, not its name."""

from vlforge.patches.patch_embed import GemmConv2d, GemmConv3d, gemm_conv_forward, is_patchable, is_patched
from vlforge.patches.registry import (
    PatchedModule,
    PatchReport,
    TransformersPatch,
    patch,
    patch_transformers,
    patched_modules,
    unpatch,
    unpatch_transformers,
)

__all__ = [
    "GemmConv2d",
    "GemmConv3d",
    "PatchReport",
    "PatchedModule",
    "TransformersPatch",
    "gemm_conv_forward",
    "is_patchable",
    "is_patched",
    "patch",
    "patch_transformers",
    "patched_modules",
    "unpatch",
    "unpatch_transformers",
]
