// The page's entry point: tabs, the model's name and context length, and the
// API-key prompt. Loaded as a module from this origin (the CSP allows nothing else).
import { apiJson, apiKey, setApiKey, withCommas } from './api.js';
import { initChat, setChatModel } from './chat.js';
import { initDeployment, loadDeployment } from './deployment.js';
import { initMetrics } from './metrics.js';

const $ = (id) => document.getElementById(id);

function showTab(panelId) {
  for (const tab of document.querySelectorAll('[role=tab]')) {
    const on = tab.dataset.panel === panelId;
    tab.setAttribute('aria-selected', on ? 'true' : 'false');
    $(tab.dataset.panel).hidden = !on;
  }
  if (panelId === 'panel-deployment') loadDeployment();
  history.replaceState(null, '', '#' + panelId.replace('panel-', ''));
}

async function loadModel() {
  try {
    const models = await apiJson('/v1/models');
    const m = models.data && models.data[0];
    if (!m) return;
    $('model-name').textContent = m.id;
    $('model-context').textContent = m.max_model_len ? `context ${withCommas(m.max_model_len)} tokens` : '';
    setChatModel(m.id);
    $('key-banner').hidden = true;
  } catch (e) {
    $('model-name').textContent = e.status === 401 ? 'API key needed' : 'model unavailable (' + e.message + ')';
  }
}

function askForKey(message) {
  $('key-banner').hidden = false;
  $('key-message').textContent = message || '';
  $('api-key-input').focus();
}

window.addEventListener('shardlm:need-key', (e) => {
  askForKey(e.detail && e.detail.hadKey ? 'That key was refused; try another.' : '');
});

document.addEventListener('DOMContentLoaded', () => {
  for (const tab of document.querySelectorAll('[role=tab]')) tab.addEventListener('click', () => showTab(tab.dataset.panel));
  $('key-form').addEventListener('submit', (e) => {
    e.preventDefault();
    setApiKey($('api-key-input').value.trim());
    $('api-key-input').value = '';
    $('key-message').textContent = 'checking…';
    loadModel();
    if (!$('panel-deployment').hidden) loadDeployment();
  });
  $('key-button').addEventListener('click', () => askForKey(apiKey() ? 'A key is set for this tab; enter another to replace it.' : ''));
  initChat();
  initDeployment();
  initMetrics();
  loadModel();
  const wanted = 'panel-' + (location.hash || '#chat').slice(1);
  if ($(wanted) && wanted !== 'panel-chat') showTab(wanted);
});
