//! raylet-tune's integration tests, one binary (each test still runs in a
//! process of its own under nextest): the Tuner, schedulers, restore, results
//! in pandas, MLflow, object storage, Train trials and the dashboard in a
//! real browser.

mod browser;

mod dashboard_browser;
mod mlflow;
mod object_storage;
mod restore;
mod results_in_pandas;
mod schedulers;
mod train_trials;
mod tuner;
