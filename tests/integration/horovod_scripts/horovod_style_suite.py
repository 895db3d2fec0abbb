"""Horovod-style tests, written as Horovod's own test/parallel/test_torch.py writes them (a
unittest.TestCase, ``import horovod.torch as hvd``, every rank running every test in the same
order), for the behaviours Horovod's suite defines: join with each collective, sparse
embeddings with both ``sparse_as_dense`` settings, and a divergence that must end in an error
instead of a hang. Horovod's suite itself is not distributed with its sources, so these are
reconstructions of its tests of the same names, not copies.

Run as Horovod runs its suite: ``ringtrain run --horovod-compat -np 2 python -m pytest FILE``.
"""

import itertools
import unittest

import horovod.torch as hvd
import torch


class TorchTests(unittest.TestCase):

    def cast_and_place(self, tensor, dtype):
        if dtype.is_cuda:
            return tensor.cuda(hvd.local_rank()).type(dtype)
        return tensor.type(dtype)

    def test_horovod_join_allreduce(self):
        """Test Join op with allreduce."""
        hvd.init()
        rank = hvd.rank()
        size = hvd.size()
        dtypes = [torch.IntTensor, torch.LongTensor, torch.FloatTensor, torch.DoubleTensor]
        integral_types = [torch.IntTensor, torch.LongTensor]

        dims = [1, 2, 3]
        first_join_ranks = [0, 1]
        cachings = [False, True]
        for dtype, dim, first_join_rank, caching in itertools.product(
                dtypes, dims, first_join_ranks, cachings):
            torch.manual_seed(1234)

            def div(t, s, dtype=dtype):
                # Horovod scales an integer average in C++: a truncating division
                if dtype in integral_types:
                    return torch.div(t, s, rounding_mode="trunc")
                return t / s

            # Use two tensors to test fusion
            tensor_a = torch.FloatTensor(*([5] * dim)).random_(-100, 100)
            tensor_a = self.cast_and_place(tensor_a, dtype)
            tensor_b = torch.FloatTensor(*([17] * dim)).random_(-100, 100)
            tensor_b = self.cast_and_place(tensor_b, dtype)

            if caching:
                handle_a = hvd.allreduce_async(tensor_a, name="tensor_a", average=True)
                handle_b = hvd.allreduce_async(tensor_b, name="tensor_b", average=True)
                averaged_a = hvd.synchronize(handle_a)
                averaged_b = hvd.synchronize(handle_b)

            if rank == first_join_rank:
                ret = hvd.join()
            else:
                handle_a = hvd.allreduce_async(tensor_a, name="tensor_a", average=True)
                handle_b = hvd.allreduce_async(tensor_b, name="tensor_b", average=True)
                averaged_a = hvd.synchronize(handle_a)
                averaged_b = hvd.synchronize(handle_b)
                ret = hvd.join()

                if size <= 3 or dtype in integral_types:
                    threshold = 0
                else:
                    threshold = 1e-4
                assert torch.allclose(averaged_a, div(tensor_a * (size - 1), size), threshold), \
                    'hvd.join with hvd.allreduce produces incorrect results'
                assert torch.allclose(averaged_b, div(tensor_b * (size - 1), size), threshold), \
                    'hvd.join with hvd.allreduce produces incorrect results'

            self.assertNotEqual(ret, first_join_rank,
                                msg="The return value of hvd.join() may not be equal to "
                                    "first_join_rank")

    def test_horovod_join_allgather(self):
        """Test Join op with allgather."""
        hvd.init()
        rank = hvd.rank()
        size = hvd.size()
        if size == 1:
            self.skipTest("Only one worker available")

        dims = [17] * 3
        tensor = torch.FloatTensor(*dims)

        if rank == 0:
            ret = hvd.join()
        else:
            try:
                hvd.allgather(tensor)
                assert False, 'hvd.allgather did not throw error'
            except (torch.FatalError, RuntimeError):
                pass

            ret = hvd.join()

        self.assertNotEqual(ret, 0, msg="The rank that joined first cannot be the last")

    def test_horovod_join_broadcast(self):
        """Test Join op with broadcast."""
        hvd.init()
        rank = hvd.rank()
        size = hvd.size()
        if size == 1:
            self.skipTest("Only one worker available")

        dims = [17] * 3
        tensor = torch.FloatTensor(*dims)

        if rank == 0:
            ret = hvd.join()
        else:
            try:
                hvd.broadcast(tensor, 1, name="test_horovod_join_broadcast")
                assert False, 'hvd.broadcast did not throw error'
            except (torch.FatalError, RuntimeError):
                pass

            ret = hvd.join()

        self.assertNotEqual(ret, 0, msg="The rank that joined first cannot be the last")

    def test_horovod_zz_diverged_ranks_raise_instead_of_hanging(self):
        """Each rank waits in an allgather the other never submits: both raise (Horovod would
        warn every minute and wait forever), and the next collective works."""
        hvd.init()
        if hvd.size() == 1:
            self.skipTest("Only one worker available")
        try:
            hvd.allgather(torch.ones(1, 2), name=f"diverged.{hvd.rank()}")
            assert False, 'hvd.allgather did not throw error'
        except RuntimeError as exc:
            assert "deadlock" in str(exc), str(exc)
        summed = hvd.allreduce(torch.ones(1), op=hvd.Sum, name="after.divergence")
        self.assertEqual(summed.item(), hvd.size())

    def test_sparse_embeddings(self):
        """Test that Horovod will correctly aggregate sparse gradients."""
        hvd.init()

        for sparse_as_dense in [False, True]:
            class Net(torch.nn.Module):
                def __init__(self):
                    super(Net, self).__init__()
                    self.embedding = torch.nn.Embedding(10, 3, sparse=True)

                def forward(self, x):
                    x = self.embedding(x)
                    return x

            model = Net()

            if hvd.rank() == 0:
                inp = torch.LongTensor([[1, 2, 4, 5], [4, 3, 2, 9]])
            else:
                inp = torch.LongTensor([[1, 3, 4], [4, 7, 9]])

            # list() see: https://github.com/pytorch/pytorch/issues/47594
            opt = torch.optim.SparseAdam(list(model.parameters()), lr=0.1)
            opt = hvd.DistributedOptimizer(opt, sparse_as_dense=sparse_as_dense)

            loss = model(inp).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
