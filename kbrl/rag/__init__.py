"""RA-ICL (retrieval-augmented in-context learning): kernels of similar PyTorch programs shown in the prompt.

`corpus` reads KernelBook and the AI CUDA Engineer archive into `Example`s; `embed` turns code into vectors
(sentence-transformers); `index` keeps them in FAISS with metadata (`kbrl build-rag-index`); `retrieve`
finds the nearest examples for a problem behind a leakage guard and renders them for the prompt
(`dataset_builder.prompt_option=raicl`, kbrl/training/raicl.py). Heavy libraries load on first use.
"""
