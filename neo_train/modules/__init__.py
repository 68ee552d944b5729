"""Model building blocks: MLP, interactions, DLRM, the unsharded EmbeddingBagCollection."""
from .dlrm import DLRM
from .embedding import EmbeddingBagCollection, init_table
from .interaction import CatInteraction, DCNInteraction, DotInteraction, make_interaction
from .mlp import MLP

__all__ = [
    "DLRM",
    "EmbeddingBagCollection",
    "init_table",
    "MLP",
    "DotInteraction",
    "CatInteraction",
    "DCNInteraction",
    "make_interaction",
]
