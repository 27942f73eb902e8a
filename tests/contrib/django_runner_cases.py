"""Tests a Django project writes for its tasks, run by Django's own test runner (on the test
database it creates) from test_django_tasks.py: enqueue inside atomic(), then jobs.drain()."""

from django.db import transaction
from django.test import TestCase, TransactionTestCase

from livepush import jobs
from tests.contrib.sample_django_tasks import add


class EnqueueInATransactionTestCase(TestCase):
    def test_a_task_enqueued_inside_the_test_transaction_runs(self) -> None:
        result = add.enqueue(1, b=2)
        self.assertEqual(jobs.drain(), {"succeeded": 1})
        self.assertEqual(add.get_result(result.id).return_value, 3)


class EnqueueInAtomicTransactionTestCase(TransactionTestCase):
    def test_a_task_enqueued_inside_atomic_runs(self) -> None:
        with transaction.atomic():
            result = add.enqueue(2, b=3)
        self.assertEqual(jobs.drain(), {"succeeded": 1})
        self.assertEqual(add.get_result(result.id).return_value, 5)
