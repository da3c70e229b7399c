"""vlforge's fast paths: explicit, logged, reversible patches keyed on what a module is, not its name."""

from vlforge.lazy import lazy_exports

# Public names, imported from their module on first use (see vlforge.lazy): importing one light
# submodule of this package never loads the heavy ones.
_EXPORTS = {
    "GemmConv2d": "vlforge.patches.patch_embed",
    "GemmConv3d": "vlforge.patches.patch_embed",
    "gemm_conv_forward": "vlforge.patches.gemm",
    "is_patchable": "vlforge.patches.patch_embed",
    "is_patched": "vlforge.patches.patch_embed",
    "PatchedModule": "vlforge.patches.registry",
    "PatchReport": "vlforge.patches.registry",
    "TransformersPatch": "vlforge.patches.registry",
    "patch": "vlforge.patches.registry",
    "patch_transformers": "vlforge.patches.registry",
    "patched_modules": "vlforge.patches.registry",
    "unpatch": "vlforge.patches.registry",
    "unpatch_transformers": "vlforge.patches.registry",
}
lazy_exports(__name__, _EXPORTS)

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
