"""Schema-free layers: tensors in, tensors out, each with its formula and shapes in the docstring.

Shape letters: B batch, F fields, D embedding dim, T sequence length, N flattened width, K rank/experts.
"""

from ctrkit.nn.activation import ACTIVATIONS, Dice, make_activation
from ctrkit.nn.attention import (
    AFMAttention,
    CausalTransformerBlock,
    MultiHeadSelfAttention,
    TransformerEncoderLayer,
    positional_encoding,
)
from ctrkit.nn.cin import CIN
from ctrkit.nn.crossnet import CrossNet, LowRankCrossNet, LowRankMixtureCrossNet, VectorCrossNet
from ctrkit.nn.embedding import (
    EmbeddingBagCollection,
    EmbeddingCollection,
    PooledEmbeddings,
)
from ctrkit.nn.embedding_factory import make_embeddings
from ctrkit.nn.fm import BiInteractionPooling, FFMInteraction, FMInteraction
from ctrkit.nn.interaction import DCNInteraction, DotInteraction, ProjectionInteraction
from ctrkit.nn.mlp import MLP
from ctrkit.nn.product import InnerProduct, PNNProductLayer
from ctrkit.nn.rnn import AttentionGRU, AuxiliaryNet, dien_auxiliary_loss
from ctrkit.nn.senet import SENET, BilinearInteraction
from ctrkit.nn.sequence import TargetAttention, masked_mean, masked_sum, mba_l2
from ctrkit.nn.session import BiasEncoding, BiLSTM, SessionActivation, SessionInterestExtractor

__all__ = [
    "ACTIVATIONS",
    "CIN",
    "MLP",
    "SENET",
    "AFMAttention",
    "AttentionGRU",
    "AuxiliaryNet",
    "BiInteractionPooling",
    "BiLSTM",
    "BiasEncoding",
    "BilinearInteraction",
    "CausalTransformerBlock",
    "CrossNet",
    "DCNInteraction",
    "Dice",
    "DotInteraction",
    "EmbeddingBagCollection",
    "EmbeddingCollection",
    "FFMInteraction",
    "FMInteraction",
    "InnerProduct",
    "LowRankCrossNet",
    "LowRankMixtureCrossNet",
    "MultiHeadSelfAttention",
    "PNNProductLayer",
    "PooledEmbeddings",
    "ProjectionInteraction",
    "SessionActivation",
    "SessionInterestExtractor",
    "TargetAttention",
    "TransformerEncoderLayer",
    "VectorCrossNet",
    "dien_auxiliary_loss",
    "make_activation",
    "make_embeddings",
    "masked_mean",
    "masked_sum",
    "mba_l2",
    "positional_encoding",
]
