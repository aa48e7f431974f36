import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """Statistical tests run thousands of small ops: one intra-op thread is faster, and much faster
    on a busy machine. Modules opt in with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
