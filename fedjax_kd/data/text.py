"""Text data for DS-FL's text tasks: tokenizing, the token-id npz layout, bag of words.

Itahara et al., "Distillation-Based Semi-Supervised Federated Learning for
Communication-Efficient Collaborative Training with Non-IID Private Data" (DS-FL,
IEEE TMC 2021, §4.1) evaluate two text tasks besides MNIST and Fashion-MNIST:

* **IMDb** review sentiment (25,000 / 25,000 reviews, 2 classes): the 20,000 most
  frequent words, each word an integer by frequency rank, the first 200 words of
  each review, an LSTM (``imdb_lstm``).
* **Reuters** newswire topics (Keras' 11,228 headlines split 8:2, 46 classes): the
  10,000 most frequent words, each headline a binary bag of words over them, a
  three-layer perceptron (``text_dnn``).

The word ids follow Keras' ``datasets.imdb``/``datasets.reuters`` scheme, which the
paper's preprocessing comes from: 0 is padding, 1 marks the start of a text, 2 is a
word outside the vocabulary, 3 is unused, and the word of frequency rank ``r`` (1 = the
most frequent in the training split) is ``r + 3``; with ``num_words=V`` every id is
below ``V``.
The paper keeps the *first* 200 words of a review; shorter reviews are padded with
zeros in front (Keras' ``pad_sequences`` default), so the LSTM's last state is read
right after the text's last word.

A tokenized data set is an npz file (``data.source='npz:<path>'``) in the Keras
layout plus a vocabulary (:func:`save_npz`):

* ``x_train``, ``x_test``: int32 ``[N, L]`` token ids, 0-padded; ``y_train``,
  ``y_test``: int labels;
* ``vocab_size``: a scalar, every id is below it (the mark of a token-id file);
* ``bag_of_words`` (optional scalar, true for Reuters): the model input is the binary
  bag of words ``[N, vocab_size]`` (float32 0/1, id 0 left out), made when the file
  is loaded; the file keeps the short id lists.

Its one-time open-data broadcast (DS-FL's ComU@I) counts what a sample costs on the
wire: 2 bytes per token id when the vocabulary fits 16 bits (IMDb: 200 x 2 B =
400 B), and one bit per vocabulary word for a bag of words (Reuters: 10,000 bits =
1,250 B), the paper's own per-sample sizes.

Where the files come from (nothing is downloaded by a run):

* ``python -m fedjax_kd.data.text imdb --aclimdb=DIR --out=imdb.npz``: from the
  ``aclImdb`` folder of Maas et al.'s review archive
  (https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz), tokenized here
  with Keras' ``Tokenizer`` rules (:func:`words`).
* ``python -m fedjax_kd.data.text imdb --keras --out=imdb.npz`` and ``... reuters
  --keras --out=reuters.npz``: from ``keras.datasets`` (needs Keras; it downloads its
  own copy, whose word ids are the ones the paper used).
* ``data.source='tfds:imdb_reviews'``: tensorflow-datasets' IMDb, prepared in
  ``array_record`` format, tokenized when loaded (:func:`encode_corpus`).
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
from typing import Iterable, Sequence

import numpy as np

PAD, START, OOV = 0, 1, 2
INDEX_FROM = 3          # word ranks start after this id: the most frequent word is id 4
IMDB_NUM_WORDS = 20_000
IMDB_MAXLEN = 200
REUTERS_NUM_WORDS = 10_000
# Keras' Tokenizer: these characters become spaces, then the text is lower-cased and split.
_FILTERS = '!"#$%&()*+,-./:;<=>?@[\\]^_`{|}~\t\n'
_TABLE = str.maketrans({c: ' ' for c in _FILTERS})


def words(text: str | bytes) -> list[str]:
  """The words of a text by Keras' ``text_to_word_sequence`` rules (HTML line breaks removed).

  Punctuation in ``!"#$%&()*+,-./:;<=>?@[\\]^_`{|}~`` and tabs/newlines become spaces, the
  text is lower-cased and split on spaces. IMDb reviews carry ``<br />`` line breaks, which
  are dropped first.
  """
  if isinstance(text, bytes):
    text = text.decode('utf-8', errors='replace')
  return text.replace('<br />', ' ').lower().translate(_TABLE).split()


def build_vocab(texts: Iterable[Sequence[str]]) -> dict[str, int]:
  """Word -> id by frequency rank over ``texts`` (ties broken by first appearance).

  Returns:
    ``{word: rank + INDEX_FROM}`` for every word, rank 1 the most frequent (id 4).
  """
  counts: collections.Counter = collections.Counter()
  for t in texts:
    counts.update(t)
  # Counter.most_common keeps insertion order among equal counts (first appearance).
  return {w: rank + INDEX_FROM for rank, (w, _) in enumerate(counts.most_common(), start=1)}


def encode(tokens: Sequence[str], vocab: dict[str, int], num_words: int) -> list[int]:
  """``[START] + ids``; words outside the vocabulary or with id >= ``num_words`` become OOV."""
  out = [START]
  for w in tokens:
    i = vocab.get(w, OOV)
    out.append(i if i < num_words else OOV)
  return out


def pad(seqs: Sequence[Sequence[int]], maxlen: int | None = None) -> np.ndarray:
  """int32 ``[N, L]``: each sequence's first ``maxlen`` ids, zero-padded in front.

  ``maxlen=None`` pads to the longest sequence (bag-of-words files keep every word).
  """
  longest = max((len(s) for s in seqs), default=0)
  length = longest if maxlen is None else maxlen
  out = np.zeros((len(seqs), max(length, 1)), np.int32)
  for row, s in enumerate(seqs):
    s = list(s)[:length]
    if s:
      out[row, out.shape[1] - len(s):] = s
  return out


def encode_corpus(train_texts: Sequence[str | bytes], test_texts: Sequence[str | bytes], *,
                  num_words: int = IMDB_NUM_WORDS,
                  maxlen: int | None = IMDB_MAXLEN) -> tuple[np.ndarray, np.ndarray]:
  """Raw texts -> token-id arrays, the vocabulary counted on the training texts only.

  Args:
    train_texts: the training split's texts.
    test_texts: the test split's texts.
    num_words: ids at or above this become OOV (the vocabulary size).
    maxlen: keep each text's first ``maxlen`` ids (with the start mark); None keeps all.

  Returns:
    int32 ``(x_train [N, L], x_test [M, L])``.
  """
  train_words = [words(t) for t in train_texts]
  vocab = build_vocab(train_words)
  x_train = [encode(t, vocab, num_words) for t in train_words]
  x_test = [encode(words(t), vocab, num_words) for t in test_texts]
  if maxlen is None:
    maxlen = max(len(s) for s in x_train + x_test)
  return pad(x_train, maxlen), pad(x_test, maxlen)


def bag_of_words(ids: np.ndarray, vocab_size: int) -> np.ndarray:
  """float32 ``[N, vocab_size]``: 1 where a row holds the id (padding id 0 left out).

  Keras' ``Tokenizer.sequences_to_matrix(mode='binary')``, the Reuters input of DS-FL.
  """
  ids = np.asarray(ids)
  out = np.zeros((ids.shape[0], vocab_size), np.float32)
  rows = np.repeat(np.arange(ids.shape[0]), ids.shape[1])
  out[rows, ids.reshape(-1)] = 1.0
  out[:, PAD] = 0.0
  return out


def bytes_per_sample(length: int, vocab_size: int, bag: bool) -> float:
  """What one sample costs on the wire (the open-data broadcast).

  A bag of words: one bit per vocabulary word. Token ids: ``length`` ids of the smallest of
  1, 2 or 4 bytes that holds ``vocab_size`` ids.
  """
  if bag:
    return float(-(-vocab_size // 8))
  width = 1 if vocab_size <= 1 << 8 else (2 if vocab_size <= 1 << 16 else 4)
  return float(length * width)


def save_npz(path: str, x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray,
             y_test: np.ndarray, *, vocab_size: int, bag: bool = False) -> None:
  """Writes the token-id npz layout (see the module docstring)."""
  np.savez_compressed(path, x_train=np.asarray(x_train, np.int32),
                      y_train=np.asarray(y_train, np.int64),
                      x_test=np.asarray(x_test, np.int32), y_test=np.asarray(y_test, np.int64),
                      vocab_size=np.int64(vocab_size), bag_of_words=np.bool_(bag))


# ---------------------------------------------------------------------------- converters


def read_aclimdb(root: str) -> tuple[list[str], np.ndarray, list[str], np.ndarray]:
  """Texts and labels (0 negative, 1 positive) of the ``aclImdb`` folder, in file-name order.

  Raises:
    FileNotFoundError: ``root`` lacks ``train/pos``, ``train/neg``, ``test/pos`` or
      ``test/neg``.
  """
  out = []
  for split in ('train', 'test'):
    texts, labels = [], []
    for label, sub in ((0, 'neg'), (1, 'pos')):
      folder = os.path.join(root, split, sub)
      if not os.path.isdir(folder):
        raise FileNotFoundError(f'{folder} is missing (expected the aclImdb layout: '
                                'train/pos, train/neg, test/pos, test/neg with one .txt per '
                                'review)')
      for name in sorted(os.listdir(folder)):
        if name.endswith('.txt'):
          with open(os.path.join(folder, name), encoding='utf-8', errors='replace') as f:
            texts.append(f.read())
          labels.append(label)
    out += [texts, np.asarray(labels, np.int64)]
  return out[0], out[1], out[2], out[3]


def _keras_arrays(name: str, num_words: int, maxlen: int | None):
  """``keras.datasets.<name>.load_data(num_words=...)`` as padded id arrays (needs Keras)."""
  try:
    import keras  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise SystemExit(f'--keras needs Keras installed (pip install keras): {e}') from None
  module = getattr(keras.datasets, name)
  kwargs = dict(num_words=num_words)
  if name == 'reuters':
    kwargs['test_split'] = 0.2
  (x_train, y_train), (x_test, y_test) = module.load_data(**kwargs)
  if maxlen is None:
    maxlen = max(len(s) for s in list(x_train) + list(x_test))
  return pad(list(x_train), maxlen), y_train, pad(list(x_test), maxlen), y_test


def main(argv: Sequence[str] | None = None) -> int:
  """``python -m fedjax_kd.data.text {imdb,reuters} (--aclimdb=DIR | --keras) --out=FILE``."""
  p = argparse.ArgumentParser(prog='python -m fedjax_kd.data.text',
                              description='Write DS-FL\'s IMDb or Reuters task as a token-id npz '
                              "for data.source='npz:FILE'.")
  p.add_argument('task', choices=('imdb', 'reuters'))
  src = p.add_mutually_exclusive_group(required=True)
  src.add_argument('--aclimdb', metavar='DIR', help='imdb only: the extracted aclImdb folder')
  src.add_argument('--keras', action='store_true', help='read keras.datasets (needs Keras)')
  p.add_argument('--out', required=True, help='the npz file to write (must not exist)')
  p.add_argument('--num_words', type=int, default=None,
                 help=f'vocabulary size (imdb {IMDB_NUM_WORDS}, reuters {REUTERS_NUM_WORDS})')
  p.add_argument('--maxlen', type=int, default=IMDB_MAXLEN,
                 help='imdb only: words kept per review (default 200)')
  a = p.parse_args(argv)
  if os.path.exists(a.out):
    print(f'--out: {a.out} exists; choose a new file (nothing is overwritten)', file=sys.stderr)
    return 2
  bag = a.task == 'reuters'
  num_words = a.num_words or (REUTERS_NUM_WORDS if bag else IMDB_NUM_WORDS)
  maxlen = None if bag else a.maxlen
  if a.aclimdb:
    if bag:
      print('--aclimdb: only for imdb (Reuters comes from --keras)', file=sys.stderr)
      return 2
    try:
      train, y_train, test, y_test = read_aclimdb(a.aclimdb)
    except FileNotFoundError as e:
      print(f'--aclimdb: {e}', file=sys.stderr)
      return 2
    x_train, x_test = encode_corpus(train, test, num_words=num_words, maxlen=maxlen)
  else:
    x_train, y_train, x_test, y_test = _keras_arrays(a.task, num_words, maxlen)
  save_npz(a.out, x_train, y_train, x_test, y_test, vocab_size=num_words, bag=bag)
  print(f'wrote {a.out}: {len(x_train)} train / {len(x_test)} test texts, ids of length '
        f'{x_train.shape[1]}, vocabulary {num_words}' + (', bag of words' if bag else ''))
  return 0


if __name__ == '__main__':
  sys.exit(main())
