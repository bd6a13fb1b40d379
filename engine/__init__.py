"""LACE's engine: LQL, the NFA matcher, partial-match management and the live-and-archived algorithms.

Pure Python (no Spark, FastAPI or SQLAlchemy). Entry points: :func:`engine.detector.compile` (any
query -> a statement) and :func:`engine.detector.make_detector` (a statement -> what runs it).
"""
from engine.detector import Detector, Statement, compile, make_detector

__all__ = ["Detector", "Statement", "compile", "make_detector"]
