// kiln.Trainer's native half: the C++ Trainer (train/trainer.h) over datasets of arrays by
// name, its metrics as dicts, callbacks into Python. While it trains the GIL is released;
// between steps it takes the GIL to check for Ctrl-C (KeyboardInterrupt stops the run
// where it is, the state as the last finished step left it) and to call the callbacks.
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/variant.h>

#include <cmath>
#include <variant>

#include "common.h"
#include "frontend/idx.h"
#include "runtime/collective.h"
#include "train/trainer.h"

#ifdef KILN_HAVE_MPI
#include "dist/mpi_collective.h"
#endif

namespace kiln::py {

namespace {

using namespace nb::literals;

TensorDataset dataset(nb::handle columns, std::string_view what) {
  TensorDataset d{to_tensor_map(columns, what)};
  d.check(what);
  return d;
}

nb::object number(double v) { return std::isnan(v) ? nb::none() : nb::cast(v); }

nb::dict eval_dict(const EvalMetrics& m) {
  nb::dict d;
  d["loss"] = m.loss;
  d["accuracy"] = number(m.accuracy);
  d["samples"] = m.samples;
  d["seconds"] = m.seconds;
  return d;
}

nb::dict epoch_dict(const EpochMetrics& m) {
  nb::dict d;
  d["epoch"] = m.epoch;
  d["train_loss"] = m.train_loss;
  d["train_accuracy"] = number(m.train_accuracy);
  d["test_loss"] = m.test ? nb::cast(m.test->loss) : nb::none();
  d["test_accuracy"] = m.test ? number(m.test->accuracy) : nb::none();
  d["lr"] = m.lr;
  d["steps"] = m.steps;
  d["samples"] = m.samples;
  d["seconds"] = m.seconds;
  d["samples_per_second"] = m.samples_per_second;
  return d;
}

nb::dict step_dict(const StepInfo& s) {
  nb::dict d;
  d["epoch"] = s.epoch;
  d["batch_index"] = s.batch_index;
  d["batches"] = s.batches;
  d["global_step"] = s.global_step;
  d["samples"] = s.samples;
  d["loss"] = s.loss;
  d["accuracy"] = number(s.accuracy);
  d["lr"] = s.lr;
  d["seconds"] = s.seconds;
  return d;
}

// The step callback the C++ trainer calls (GIL released): takes the GIL, raises a pending
// KeyboardInterrupt (nb::python_error, back to Python as itself), calls the user's.
// A Python object held by a C++ callback, released with the GIL (the callback may be
// destroyed on any thread).
std::shared_ptr<nb::object> held(nb::object o) {
  return std::shared_ptr<nb::object>(new nb::object(std::move(o)), [](nb::object* p) {
    nb::gil_scoped_acquire gil;
    delete p;
  });
}

std::function<void(const StepInfo&)> step_callback(nb::object user) {
  return [user = held(std::move(user))](const StepInfo& s) {
    nb::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() != 0) throw nb::python_error();
    if (!user->is_none()) (*user)(step_dict(s));
  };
}

}  // namespace

void bind_training(nb::module_& m) {
  m.def(
      "_fashion_mnist",
      [](const std::string& split, std::string dir, bool flat) {
        if (dir.empty()) dir = fashion_mnist_dir();
        Dataset d;
        {
          nb::gil_scoped_release release;
          d = load_fashion_mnist(split, dir, flat ? ImageLayout::flat : ImageLayout::nchw);
        }
        TensorDataset t = TensorDataset::from(d);
        return to_dict(t.columns, true);
      },
      "split"_a, "dir"_a = "", "flat"_a = true);
  m.def("_fashion_mnist_classes", [] {
    nb::list l;
    for (std::string_view c : fashion_mnist_classes()) l.append(nb::str(c.data(), c.size()));
    return l;
  });

  // kiln.distributed's native half (python/kiln/distributed.py).
  m.def("_launched_by_mpi", [] {
#ifdef KILN_HAVE_MPI
    return dist::launched_by_mpi();
#else
    return false;
#endif
  });
  m.def("_mpi_init", []() -> std::pair<int, int> {
#ifdef KILN_HAVE_MPI
    dist::Mpi& mpi = dist::Mpi::init();
    return {mpi.rank(), mpi.size()};
#else
    throw Error("kiln.distributed: this kiln was built without MPI (install libopenmpi-dev and openmpi-bin, then "
                "reinstall the package)");
#endif
  });
  m.def("_mpi_abort", [](const std::string& why) {
#ifdef KILN_HAVE_MPI
    dist::Mpi::init().abort(why);
#else
    throw Error(why);
#endif
  });
  m.def("_collective", []() -> std::optional<std::tuple<int, int, bool>> {
    const KilnCollective* c = kiln_rt_collective();
    if (!c) return std::nullopt;
    return std::tuple<int, int, bool>{c->rank, c->size, (c->flags & KILN_COLLECTIVE_ASYNC) != 0};
  });

  nb::class_<Trainer>(m, "_Trainer")
      .def(
          "__init__",
          [](Trainer* t, const PyGraph& model, std::variant<SGD, Adam, AdamW> optimizer, int64_t batch, bool drop_last,
             bool shuffle, uint64_t data_seed, const std::string& schedule, int64_t eval_batch, const std::string& loss,
             const std::string& accuracy, const std::string& target, std::optional<const PyGraph*> eval_model,
             int64_t epochs, const std::string& checkpoint_dir, int64_t checkpoint_every_steps, int checkpoint_keep,
             bool stop_on_nonfinite, int threads, bool distributed) {
            if (threads < 0) throw Error("threads must be 0 (every thread) or more, got " + std::to_string(threads));
            TrainerOptions o;
            std::visit([&](const auto& opt) { o.optimizer = opt; }, optimizer);
            o.batch = batch;
            o.drop_last = drop_last;
            o.shuffle = shuffle;
            o.data_seed = data_seed;
            if (!schedule.empty()) o.schedule = LrSchedule::parse(schedule);
            o.eval_batch = eval_batch;
            o.loss = loss;
            o.accuracy = accuracy;
            o.compile.target = target;
            o.compile.threads = threads;
            o.distributed = distributed;
            if (eval_model && *eval_model) o.eval_model = (*eval_model)->graph;
            o.epochs = epochs;
            o.checkpoint_dir = checkpoint_dir;
            o.checkpoint_every_steps = checkpoint_every_steps;
            o.checkpoint_keep = checkpoint_keep;
            o.stop_on_nonfinite = stop_on_nonfinite;
            Released release;
            new (t) Trainer(model.graph, model.state, std::move(o));
          },
          "model"_a, "optimizer"_a, "batch"_a, "drop_last"_a, "shuffle"_a, "data_seed"_a, "schedule"_a, "eval_batch"_a,
          "loss"_a, "accuracy"_a, "target"_a, "eval_model"_a.none(), "epochs"_a, "checkpoint_dir"_a,
          "checkpoint_every_steps"_a, "checkpoint_keep"_a, "stop_on_nonfinite"_a, "threads"_a, "distributed"_a)
      .def(
          "fit",
          [](Trainer& t, nb::handle train, nb::handle test, int64_t epochs, nb::object on_step, nb::object on_epoch) {
            TensorDataset tr = dataset(train, "train data");
            TensorDataset te = test.is_none() ? TensorDataset{} : dataset(test, "test data");
            FitCallbacks cb;
            cb.on_step = step_callback(std::move(on_step));
            if (!on_epoch.is_none()) {
              cb.on_epoch = [user = held(std::move(on_epoch))](const EpochMetrics& e) {
                nb::gil_scoped_acquire gil;
                (*user)(epoch_dict(e));
              };
            }
            std::vector<EpochMetrics> done;
            {
              Released release;
              done = t.fit(tr, te, epochs, cb);
            }
            nb::list out;
            for (const EpochMetrics& e : done) out.append(epoch_dict(e));
            return out;
          },
          "train"_a, "test"_a.none(), "epochs"_a, "on_step"_a.none(), "on_epoch"_a.none())
      .def(
          "train_epoch",
          [](Trainer& t, nb::handle data, nb::object on_step) {
            TensorDataset d = dataset(data, "train data");
            auto cb = step_callback(std::move(on_step));
            EpochMetrics e;
            {
              Released release;
              e = t.train_epoch(d, cb);
            }
            return epoch_dict(e);
          },
          "data"_a, "on_step"_a.none())
      .def(
          "evaluate",
          [](Trainer& t, nb::handle data) {
            TensorDataset d = dataset(data, "eval data");
            EvalMetrics e;
            {
              Released release;
              e = t.evaluate(d);
            }
            return eval_dict(e);
          },
          "data"_a)
      .def(
          "train_batch",
          [](Trainer& t, nb::handle batch) {
            TensorMap b = to_tensor_map(batch, "batch");
            TensorMap out;
            {
              Released release;
              out = t.train_batch(b);
            }
            return to_dict(out, true);
          },
          "batch"_a)
      .def(
          "_bench_epoch",
          [](Trainer& t, nb::handle data) {
            TensorDataset d = dataset(data, "train data");
            Released release;
            return t.train_epoch(d).seconds;
          },
          "data"_a, "One epoch as C++ runs it (no Python callback): its seconds (bench/python).")
      .def_prop_ro("history",
                   [](const Trainer& t) {
                     nb::list l;
                     for (const EpochMetrics& e : t.history()) l.append(epoch_dict(e));
                     return l;
                   })
      .def_prop_ro("epoch", &Trainer::epoch)
      .def_prop_ro("global_step", &Trainer::global_step)
      .def("state",
           [](const Trainer& t) {
             TensorMap s;
             {
               Released release;
               s = t.state();
             }
             return to_dict(s, true);
           })
      .def(
          "set_state",
          [](Trainer& t, nb::handle s) {
            TensorMap m = to_tensor_map(s, "state");
            Released release;
            t.set_state(m);
          },
          "state"_a)
      .def(
          "save_checkpoint",
          [](const Trainer& t, const std::string& path) {
            Released release;
            t.save_checkpoint(path);
          },
          "path"_a)
      .def(
          "load_checkpoint",
          [](Trainer& t, const std::string& path) {
            Released release;
            t.load_checkpoint(path);
          },
          "path"_a)
      .def("resume", [](Trainer& t) {
        Released release;
        return t.resume();
      })
      .def_prop_ro("step_executable", [](Trainer& t) -> Executable& { return t.step_executable(); },
                   nb::rv_policy::reference_internal)
      .def_prop_ro("eval_executable", [](Trainer& t) -> Executable& { return t.eval_executable(); },
                   nb::rv_policy::reference_internal);
}

}  // namespace kiln::py
