"""capture: frame conversion. Bytecode decode/assemble (bytecode.py), generated-code
building with region labels (bytecode_builder.py), resume functions at graph breaks
(resume.py), and the symbolic interpreter that drives them."""
