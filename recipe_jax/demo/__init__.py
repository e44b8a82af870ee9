"""The demo task shared by the demo recipe's stages: multi-digit addition, answers boxed."""
