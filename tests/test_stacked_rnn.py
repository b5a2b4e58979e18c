"""tff_algos.stacked_rnn: the recurrent presets on stacked weights equal
Keras' model, client by client."""

import numpy as np
import pytest
import tensorflow as tf

from tasks import shakespeare_leaf
from tff_algos import stacked_rnn


def _client_weights(model, k, rng):
  """`k` perturbed copies of the model's trainable weights."""
  base = [w.numpy() for w in model.trainable_weights]
  return [
      [w + 0.3 * rng.standard_normal(w.shape).astype(np.float32) for w in base]
      for _ in range(k)
  ]


@pytest.mark.parametrize('preset', ['deltafl', 'qffl', 'fedprox'])
def test_stacked_forward_equals_keras_per_client(preset):
  spec = shakespeare_leaf.PRESETS[preset]
  model = shakespeare_leaf.create_keras_model(spec, units=7, seed=1)
  forward = stacked_rnn.stacked_forward(model)
  assert forward is not None
  rng = np.random.default_rng(0)
  k, b = 3, 4
  clients = _client_weights(model, k, rng)
  x = rng.integers(0, spec.num_classes, (k, b, spec.window)).astype(np.int32)
  stacked = [np.stack(ws) for ws in zip(*clients)]
  got = tf.function(forward)([tf.constant(w) for w in stacked], tf.constant(x))
  assert got.shape == (k, b, spec.num_classes)
  for c in range(k):
    model.set_weights(clients[c])
    want = model(x[c], training=True).numpy()
    np.testing.assert_allclose(got[c].numpy(), want, rtol=2e-5, atol=2e-6)
  # Different weights give different logits: the clients are not mixed up.
  assert np.abs(got[0].numpy() - got[1].numpy()).max() > 1e-2


def _model(*layers):
  model = tf.keras.Sequential(
      [tf.keras.Input([5], dtype=tf.int32)] + list(layers)
  )
  return model


def test_models_it_does_not_cover_are_refused():
  onehot = lambda: shakespeare_leaf.OneHot(4)
  dense = lambda **kw: tf.keras.layers.Dense(4, **kw)
  covered = _model(onehot(), tf.keras.layers.GRU(3), dense())
  assert stacked_rnn.stacked_forward(covered) is not None
  refused = {
      'gru reset_before': _model(
          onehot(), tf.keras.layers.GRU(3, reset_after=False), dense()
      ),
      'dropout': _model(onehot(), tf.keras.layers.GRU(3, dropout=0.1), dense()),
      'relu cell': _model(
          onehot(), tf.keras.layers.LSTM(3, activation='relu'), dense()
      ),
      'softmax head': _model(
          onehot(), tf.keras.layers.GRU(3), dense(activation='softmax')
      ),
      'sequences out': _model(
          onehot(), tf.keras.layers.GRU(3, return_sequences=True), dense()
      ),
      'masked embedding': _model(
          tf.keras.layers.Embedding(4, 2, mask_zero=True),
          tf.keras.layers.GRU(3),
          dense(),
      ),
      'simple rnn': _model(onehot(), tf.keras.layers.SimpleRNN(3), dense()),
      'no recurrence': _model(onehot(), tf.keras.layers.Flatten(), dense()),
  }
  for name, model in refused.items():
    assert stacked_rnn.stacked_forward(model) is None, name
